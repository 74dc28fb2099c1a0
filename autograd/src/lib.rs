//! cohort-autograd: Reverse-mode differentiation on a tape, nn layers with named parameters.
