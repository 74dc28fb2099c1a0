//! Host arrays, the examples that sources produce before they become tensors, and the traits that let a pipeline
//! slice a collection into examples ([`Slices`]) and stack examples into a batch ([`Stack`]).

use crate::error::{Error, Result};

/// The elements of an [`Array`].
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// 32-bit floats (features, images).
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// 32-bit integers (labels, token ids).
    I32(Vec<i32>),
    /// Bytes (raw pixels, masks).
    U8(Vec<u8>),
}

impl ArrayData {
    fn len(&self) -> usize {
        match self {
            ArrayData::F32(v) => v.len(),
            ArrayData::F64(v) => v.len(),
            ArrayData::I32(v) => v.len(),
            ArrayData::U8(v) => v.len(),
        }
    }

    /// The element type's name (`f32`, `f64`, `i32`, `u8`), as `cohort_tensor::DType` displays it.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            ArrayData::F32(_) => "f32",
            ArrayData::F64(_) => "f64",
            ArrayData::I32(_) => "i32",
            ArrayData::U8(_) => "u8",
        }
    }
}

/// A dense, row-major host array with a shape: one example (or one field of one), or a batch of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    shape: Vec<usize>,
    data: ArrayData,
}

macro_rules! typed {
    ($from:ident, $as:ident, $into:ident, $variant:ident, $t:ty) => {
        /// An array of this element type.
        ///
        /// # Errors
        /// [`Error::Shape`] when `data.len()` is not the product of `shape`.
        pub fn $from(data: Vec<$t>, shape: &[usize]) -> Result<Array> {
            Array::new(ArrayData::$variant(data), shape)
        }
        /// The elements when the array holds this type.
        pub fn $as(&self) -> Option<&[$t]> {
            match &self.data {
                ArrayData::$variant(v) => Some(v),
                _ => None,
            }
        }
        /// Take the elements when the array holds this type.
        pub fn $into(self) -> Option<Vec<$t>> {
            match self.data {
                ArrayData::$variant(v) => Some(v),
                _ => None,
            }
        }
    };
}

impl Array {
    /// An array of `data` with `shape` (`[]` for a scalar).
    ///
    /// # Errors
    /// [`Error::Shape`] when the element count is not the product of `shape`.
    pub fn new(data: ArrayData, shape: &[usize]) -> Result<Array> {
        let want: usize = shape.iter().product();
        if data.len() != want {
            return Err(Error::Shape {
                op: "Array::new",
                reason: format!(
                    "{} elements do not fill shape {shape:?} ({want} elements)",
                    data.len()
                ),
            });
        }
        Ok(Array {
            shape: shape.to_vec(),
            data,
        })
    }

    typed!(from_f32, as_f32, into_f32, F32, f32);
    typed!(from_f64, as_f64, into_f64, F64, f64);
    typed!(from_i32, as_i32, into_i32, I32, i32);
    typed!(from_u8, as_u8, into_u8, U8, u8);

    /// A scalar `i32` (a label).
    pub fn scalar_i32(v: i32) -> Array {
        Array {
            shape: vec![],
            data: ArrayData::I32(vec![v]),
        }
    }

    /// A scalar `f32`.
    pub fn scalar_f32(v: f32) -> Array {
        Array {
            shape: vec![],
            data: ArrayData::F32(vec![v]),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements.
    pub fn data(&self) -> &ArrayData {
        &self.data
    }

    /// Take the elements.
    pub fn into_data(self) -> ArrayData {
        self.data
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.data.len()
    }

    /// The same elements under another shape with as many elements.
    ///
    /// # Errors
    /// [`Error::Shape`] when the element counts differ.
    pub fn reshape(self, shape: &[usize]) -> Result<Array> {
        Array::new(self.data, shape)
    }

    /// Row `i` along the first dimension.
    ///
    /// # Errors
    /// [`Error::Shape`] for a scalar or an index past the first dimension.
    pub fn row(&self, i: usize) -> Result<Array> {
        let Some((&n, rest)) = self.shape.split_first() else {
            return Err(Error::Shape {
                op: "Array::row",
                reason: "a scalar has no rows".into(),
            });
        };
        if i >= n {
            return Err(Error::Shape {
                op: "Array::row",
                reason: format!("row {i} of an array of shape {:?}", self.shape),
            });
        }
        let w: usize = rest.iter().product();
        let r = i * w..(i + 1) * w;
        let data = match &self.data {
            ArrayData::F32(v) => ArrayData::F32(v[r].to_vec()),
            ArrayData::F64(v) => ArrayData::F64(v[r].to_vec()),
            ArrayData::I32(v) => ArrayData::I32(v[r].to_vec()),
            ArrayData::U8(v) => ArrayData::U8(v[r].to_vec()),
        };
        Ok(Array {
            shape: rest.to_vec(),
            data,
        })
    }

    /// Stack arrays of equal shape and type along a new first dimension.
    ///
    /// # Errors
    /// [`Error::Shape`] for no arrays, or arrays whose shapes or element types differ.
    pub fn stack(items: Vec<Array>) -> Result<Array> {
        let first = check_same_type(&items, "batch")?;
        if let Some(bad) = items.iter().find(|a| a.shape != first.shape) {
            return Err(Error::Shape {
                op: "batch",
                reason: format!(
                    "examples of shapes {:?} and {:?} cannot be stacked (use padded_batch for variable lengths)",
                    first.shape, bad.shape
                ),
            });
        }
        let mut shape = vec![items.len()];
        shape.extend_from_slice(&first.shape);
        let data = concat(items);
        Array::new(data, &shape)
    }

    /// Stack arrays of equal rank and type, padding every dimension to the largest size with `pad`.
    ///
    /// # Errors
    /// [`Error::Shape`] for no arrays, or arrays whose ranks or element types differ.
    pub fn stack_padded(items: Vec<Array>, pad: f64) -> Result<Array> {
        let first = check_same_type(&items, "padded_batch")?;
        let rank = first.shape.len();
        if let Some(bad) = items.iter().find(|a| a.shape.len() != rank) {
            return Err(Error::Shape {
                op: "padded_batch",
                reason: format!(
                    "examples of ranks {rank} and {} cannot be padded to one shape",
                    bad.shape.len()
                ),
            });
        }
        let mut max = first.shape.clone();
        for a in &items {
            for (m, &s) in max.iter_mut().zip(&a.shape) {
                *m = (*m).max(s);
            }
        }
        if items.iter().all(|a| a.shape == max) {
            return Array::stack(items);
        }
        let mut shape = vec![items.len()];
        shape.extend_from_slice(&max);
        let padded: Vec<Array> = items.into_iter().map(|a| pad_to(a, &max, pad)).collect();
        let data = concat(padded);
        Array::new(data, &shape)
    }
}

fn check_same_type<'a>(items: &'a [Array], op: &'static str) -> Result<&'a Array> {
    let first = items.first().ok_or_else(|| Error::Shape {
        op,
        reason: "no examples to stack".into(),
    })?;
    if let Some(bad) = items
        .iter()
        .find(|a| std::mem::discriminant(&a.data) != std::mem::discriminant(&first.data))
    {
        return Err(Error::Shape {
            op,
            reason: format!(
                "examples of types {} and {} cannot be stacked",
                first.data.dtype_name(),
                bad.data.dtype_name()
            ),
        });
    }
    Ok(first)
}

/// Concatenate the data of same-typed arrays.
fn concat(items: Vec<Array>) -> ArrayData {
    let total: usize = items.iter().map(Array::elem_count).sum();
    macro_rules! cat {
        ($variant:ident) => {{
            let mut out = Vec::with_capacity(total);
            for a in items {
                if let ArrayData::$variant(v) = a.data {
                    out.extend_from_slice(&v);
                }
            }
            ArrayData::$variant(out)
        }};
    }
    match items.first().map(|a| &a.data) {
        Some(ArrayData::F64(_)) => cat!(F64),
        Some(ArrayData::I32(_)) => cat!(I32),
        Some(ArrayData::U8(_)) => cat!(U8),
        _ => cat!(F32),
    }
}

/// Copy `a` into an array of shape `max` (each dimension at least `a`'s), filling the rest with `pad`.
fn pad_to(a: Array, max: &[usize], pad: f64) -> Array {
    fn fill<T: Copy>(src: &[T], shape: &[usize], max: &[usize], pad: T) -> Vec<T> {
        let total: usize = max.iter().product();
        let mut out = vec![pad; total];
        let rank = shape.len();
        if rank == 0 || src.is_empty() {
            out[..src.len()].copy_from_slice(src);
            return out;
        }
        let inner = shape[rank - 1];
        let rows = src.len() / inner.max(1);
        for r in 0..rows {
            // the row's multi-index over the leading dims, re-linearised in the padded shape
            let mut rem = r;
            let mut dst = 0;
            let mut stride = max[rank - 1];
            for d in (0..rank - 1).rev() {
                let idx = rem % shape[d];
                rem /= shape[d];
                dst += idx * stride;
                stride *= max[d];
            }
            out[dst..dst + inner].copy_from_slice(&src[r * inner..(r + 1) * inner]);
        }
        out
    }
    let data = match &a.data {
        ArrayData::F32(v) => ArrayData::F32(fill(v, &a.shape, max, pad as f32)),
        ArrayData::F64(v) => ArrayData::F64(fill(v, &a.shape, max, pad)),
        ArrayData::I32(v) => ArrayData::I32(fill(v, &a.shape, max, pad as i32)),
        ArrayData::U8(v) => ArrayData::U8(fill(v, &a.shape, max, pad as u8)),
    };
    Array {
        shape: max.to_vec(),
        data,
    }
}

/// Examples that can be stacked into a batch, as [`Dataset::batch`](crate::Dataset::batch) does.
pub trait Stack: Sized + Send + 'static {
    /// What a batch of these is.
    type Batched: Send + 'static;
    /// Stack examples along a new first dimension.
    ///
    /// # Errors
    /// [`Error::Shape`] when the examples do not fit together.
    fn stack(items: Vec<Self>) -> Result<Self::Batched>;
    /// Stack examples, padding variable-size dimensions with `pad`; the default stacks unpadded.
    ///
    /// # Errors
    /// [`Error::Shape`] when the examples do not fit together.
    fn stack_padded(items: Vec<Self>, pad: f64) -> Result<Self::Batched> {
        let _ = pad;
        Self::stack(items)
    }
}

impl Stack for Array {
    type Batched = Array;
    fn stack(items: Vec<Self>) -> Result<Array> {
        Array::stack(items)
    }
    fn stack_padded(items: Vec<Self>, pad: f64) -> Result<Array> {
        Array::stack_padded(items, pad)
    }
}

macro_rules! stack_scalar {
    ($($t:ty),*) => {$(
        impl Stack for $t {
            type Batched = Vec<$t>;
            fn stack(items: Vec<Self>) -> Result<Vec<$t>> {
                Ok(items)
            }
        }
    )*};
}
stack_scalar!(i64, u64, i32, u32, u8, f32, f64, usize, String);

macro_rules! stack_tuple {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Stack),+> Stack for ($($name,)+) {
            type Batched = ($($name::Batched,)+);
            #[allow(non_snake_case)]
            fn stack(items: Vec<Self>) -> Result<Self::Batched> {
                $(let mut $name = Vec::with_capacity(items.len());)+
                for it in items {
                    $($name.push(it.$idx);)+
                }
                Ok(($($name::stack($name)?,)+))
            }
            #[allow(non_snake_case)]
            fn stack_padded(items: Vec<Self>, pad: f64) -> Result<Self::Batched> {
                $(let mut $name = Vec::with_capacity(items.len());)+
                for it in items {
                    $($name.push(it.$idx);)+
                }
                Ok(($($name::stack_padded($name, pad)?,)+))
            }
        }
    };
}
stack_tuple!(A 0);
stack_tuple!(A 0, B 1);
stack_tuple!(A 0, B 1, C 2);
stack_tuple!(A 0, B 1, C 2, D 3);

/// A random-access collection whose first dimension can be sliced into examples, as
/// [`Dataset::from_tensor_slices`](crate::Dataset::from_tensor_slices) does.
pub trait Slices: Send + Sync + 'static {
    /// One example.
    type Item: Send + 'static;
    /// Number of examples (the first dimension).
    fn len(&self) -> usize;
    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Example `i`.
    ///
    /// # Errors
    /// When `i` is out of range or the data cannot be sliced.
    fn slice(&self, i: usize) -> Result<Self::Item>;
}

impl Slices for Array {
    type Item = Array;
    fn len(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }
    fn slice(&self, i: usize) -> Result<Array> {
        self.row(i)
    }
}

impl<T: Clone + Send + Sync + 'static> Slices for Vec<T> {
    type Item = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn slice(&self, i: usize) -> Result<T> {
        self.get(i).cloned().ok_or_else(|| Error::Shape {
            op: "from_tensor_slices",
            reason: format!("index {i} past the end of {} elements", <[T]>::len(self)),
        })
    }
}

macro_rules! slices_tuple {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Slices),+> Slices for ($($name,)+) {
            type Item = ($($name::Item,)+);
            fn len(&self) -> usize {
                let mut n = usize::MAX;
                $(n = n.min(self.$idx.len());)+
                n
            }
            fn slice(&self, i: usize) -> Result<Self::Item> {
                Ok(($(self.$idx.slice(i)?,)+))
            }
        }
    };
}
slices_tuple!(A 0, B 1);
slices_tuple!(A 0, B 1, C 2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_and_rows_round_trip() {
        let a = Array::from_f32((0..6).map(|x| x as f32).collect(), &[3, 2]).unwrap();
        let rows: Vec<Array> = (0..3).map(|i| a.row(i).unwrap()).collect();
        assert_eq!(rows[1].as_f32().unwrap(), &[2.0, 3.0]);
        assert_eq!(Array::stack(rows).unwrap(), a);
        assert!(a.row(3).is_err());
        assert!(Array::scalar_i32(1).row(0).is_err());
    }

    #[test]
    fn stack_rejects_mixed_shapes_and_types() {
        let a = Array::from_f32(vec![1.0, 2.0], &[2]).unwrap();
        let b = Array::from_f32(vec![1.0], &[1]).unwrap();
        let c = Array::from_i32(vec![1, 2], &[2]).unwrap();
        assert!(Array::stack(vec![a.clone(), b]).is_err());
        assert!(Array::stack(vec![a, c]).is_err());
        assert!(Array::stack(vec![]).is_err());
        assert!(Array::new(ArrayData::U8(vec![1, 2, 3]), &[2]).is_err());
    }

    #[test]
    fn padded_stack_pads_every_dim() {
        let a = Array::from_i32(vec![1, 2, 3], &[3]).unwrap();
        let b = Array::from_i32(vec![4], &[1]).unwrap();
        let s = Array::stack_padded(vec![a, b], 0.0).unwrap();
        assert_eq!(s.shape(), &[2, 3]);
        assert_eq!(s.as_i32().unwrap(), &[1, 2, 3, 4, 0, 0]);
        let m = Array::from_f32(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let n = Array::from_f32(vec![5.0, 6.0, 7.0], &[1, 3]).unwrap();
        let s = Array::stack_padded(vec![m, n], -1.0).unwrap();
        assert_eq!(s.shape(), &[2, 2, 3]);
        assert_eq!(
            s.as_f32().unwrap(),
            &[
                1.0, 2.0, -1.0, 3.0, 4.0, -1.0, 5.0, 6.0, 7.0, -1.0, -1.0, -1.0
            ]
        );
    }

    #[test]
    fn tuples_stack_per_field() {
        let items = vec![
            (Array::scalar_f32(1.0), Array::scalar_i32(3)),
            (Array::scalar_f32(2.0), Array::scalar_i32(4)),
        ];
        let (x, y) = <(Array, Array)>::stack(items).unwrap();
        assert_eq!(x.shape(), &[2]);
        assert_eq!(y.as_i32().unwrap(), &[3, 4]);
    }
}
