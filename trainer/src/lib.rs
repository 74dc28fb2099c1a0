//! cohort-trainer: Train a cohort of models in one process: schedules, checkpoints, logs; the cohort binary.
