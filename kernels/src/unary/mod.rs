//! Element-wise unary float ops, including the scalar forms (`x + c`, `x * c`, `x^c`, `x > c`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// A unary element-wise op; the scalar-carrying variants hold their constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// max(x, 0)
    Relu,
    /// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
    Gelu,
    /// tanh(x)
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// e^x
    Exp,
    /// ln(x)
    Log,
    /// √x
    Sqrt,
    /// |x|
    Abs,
    /// x²
    Square,
    /// x + c
    AddScalar(f64),
    /// x · c
    MulScalar(f64),
    /// x^c
    Powf(f64),
    /// 1 if x > c else 0
    GtScalar(f64),
    /// 1 if x < c else 0
    LtScalar(f64),
}

impl UnaryOp {
    /// The op's name, as used in kernel names and error messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Square => "square",
            UnaryOp::AddScalar(_) => "add_scalar",
            UnaryOp::MulScalar(_) => "mul_scalar",
            UnaryOp::Powf(_) => "powf",
            UnaryOp::GtScalar(_) => "gt_scalar",
            UnaryOp::LtScalar(_) => "lt_scalar",
        }
    }

    /// The op applied to one `f64` (the reference the kernels are tested against).
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Square => x * x,
            UnaryOp::AddScalar(c) => x + c,
            UnaryOp::MulScalar(c) => x * c,
            UnaryOp::Powf(c) => x.powf(c),
            UnaryOp::GtScalar(c) => f64::from(u8::from(x > c)),
            UnaryOp::LtScalar(c) => f64::from(u8::from(x < c)),
        }
    }
}
