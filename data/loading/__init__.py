"""Loading a split into batches: the sampler, the crop boxes, the loader's workers and their fused decode, and the
decode on the training device (its producer thread, and what data.decode=auto chooses)."""
