"""Where a training step executes. train.py drives a Backend (base.py) without knowing which one: build.py picks its
class by the device name, and the class builds itself from the config; config.py is the device section."""
