//! Element-wise binary ops with numpy broadcasting, and comparisons that give 1/0.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// A binary element-wise op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// max(a, b)
    Maximum,
    /// min(a, b)
    Minimum,
    /// 1 if a > b else 0
    Gt,
    /// 1 if a >= b else 0
    Ge,
    /// 1 if a < b else 0
    Lt,
    /// 1 if a <= b else 0
    Le,
    /// 1 if a == b else 0
    Eq,
}

impl BinaryOp {
    /// The op's name, as used in kernel names and error messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Eq => "eq",
        }
    }
}

/// How the operands of a broadcast binary op map onto the output, after dropping size-1 dims and
/// merging dims that are contiguous in both operands.
///
/// The output is `rows` rows of `inner` elements; row `r` of the output reads the lhs at
/// `lhs_offset(r)` and the rhs at `rhs_offset(r)`, with an inner step of `lhs_inner_step` /
/// `rhs_inner_step` (each 0 for a broadcast dim, or 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BroadcastPlan {
    /// Output dims above the inner one (after merging).
    pub outer_dims: Vec<usize>,
    /// lhs strides of `outer_dims` (0 where broadcast).
    pub lhs_outer_strides: Vec<usize>,
    /// rhs strides of `outer_dims` (0 where broadcast).
    pub rhs_outer_strides: Vec<usize>,
    /// Length of the innermost merged dim.
    pub inner: usize,
    /// lhs step along the inner dim: 0 or 1.
    pub lhs_inner_step: usize,
    /// rhs step along the inner dim: 0 or 1.
    pub rhs_inner_step: usize,
}

/// Strides of `shape` (row-major, contiguous) aligned to the right of `out`, 0 where broadcast.
///
/// # Panics
/// When `shape` does not broadcast to `out`; callers check first.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    assert!(shape.len() <= out.len(), "broadcast: rank too large");
    let pad = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        let d = shape[i];
        assert!(
            d == out[pad + i] || d == 1,
            "broadcast: {shape:?} to {out:?}"
        );
        strides[pad + i] = if d == 1 { 0 } else { s };
        s *= d;
    }
    strides
}

impl BroadcastPlan {
    /// Plans `lhs_shape (op) rhs_shape -> out_shape`.
    pub fn new(lhs_shape: &[usize], rhs_shape: &[usize], out_shape: &[usize]) -> Self {
        let ls = broadcast_strides(lhs_shape, out_shape);
        let rs = broadcast_strides(rhs_shape, out_shape);
        // Drop size-1 dims, then merge a dim into the next when both operands are contiguous across.
        let mut dims: Vec<(usize, usize, usize)> = Vec::new();
        for i in 0..out_shape.len() {
            if out_shape[i] == 1 {
                continue;
            }
            let cur = (out_shape[i], ls[i], rs[i]);
            if let Some(last) = dims.last_mut() {
                // `last` is the outer dim; it merges with `cur` when its stride = cur's stride·size.
                if last.1 == cur.1 * cur.0 && last.2 == cur.2 * cur.0 {
                    *last = (last.0 * cur.0, cur.1, cur.2);
                    continue;
                }
            }
            dims.push(cur);
        }
        let (inner, lhs_inner_step, rhs_inner_step) = dims.pop().unwrap_or((1, 0, 0));
        BroadcastPlan {
            outer_dims: dims.iter().map(|d| d.0).collect(),
            lhs_outer_strides: dims.iter().map(|d| d.1).collect(),
            rhs_outer_strides: dims.iter().map(|d| d.2).collect(),
            inner,
            lhs_inner_step,
            rhs_inner_step,
        }
    }

    /// Number of output rows.
    pub fn rows(&self) -> usize {
        self.outer_dims.iter().product()
    }

    /// (lhs, rhs) element offsets of output row `r`.
    #[inline]
    pub fn offsets(&self, mut r: usize) -> (usize, usize) {
        let (mut lo, mut ro) = (0, 0);
        for i in (0..self.outer_dims.len()).rev() {
            let d = self.outer_dims[i];
            let idx = r % d;
            r /= d;
            lo += idx * self.lhs_outer_strides[i];
            ro += idx * self.rhs_outer_strides[i];
        }
        (lo, ro)
    }
}
