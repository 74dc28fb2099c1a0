//! cohort-data: A tf.data-style input pipeline: sources, map, shuffle, batch, prefetch, shared iterators.
