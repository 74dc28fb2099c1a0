//! cohort-alloc: BFC caching allocator with per-model budgets, memory sources, stats and trace replay.
