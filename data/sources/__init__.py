"""Where images come from: the embedded synthetic set, ImageNet's folder layouts (with the devkit's labels), a
folder tree's compact index, and the Split that every source gives the loader."""
