//! cohort-optim: Optimizers (SGD, Adam, AdamW) and learning-rate schedules.
