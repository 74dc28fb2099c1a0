use serde::Serialize;

use super::{ActivationKind, Conv2d, Features, Layout, Linear, Module, Sequential};
use crate::spec::{
    Fields, LayerCtx, LayerSpec, Shape, SpecResult, activation_count, build_layers, read_layers,
    walk,
};
use crate::{Error, Param, Result, Tape};

/// `y = inner(x) + shortcut(x)`: the shortcut is `projection(x)` when there is a projection, `x` itself otherwise.
///
/// The two sides may come in different layouts: a shared input is broadcast to the members of the other side, and
/// per-member images meet packed ones in the packed layout (`[B, M*C, H, W]`). Parameters and buffers are named
/// `inner.layers.<i>.<name>` and `projection.<name>`. The caller picks the projection (a 1x1 [`Conv2d`] with the
/// inner stride for images, a [`Linear`] for dense features); the residual only adds.
///
/// [`Conv2d`]: super::Conv2d
/// [`Linear`]: super::Linear
#[derive(Debug)]
pub struct Residual {
    inner: Sequential,
    projection: Option<Box<dyn Module>>,
    members: usize,
}

impl Residual {
    /// `inner(x) + projection(x)` (or `+ x`) for a model of `members` members.
    pub fn new(inner: Sequential, projection: Option<Box<dyn Module>>, members: usize) -> Residual {
        let r = Residual {
            inner,
            projection,
            members,
        };
        // Names relative to the residual; a Sequential holding it prefixes them again.
        for (name, p) in r.params().into_iter().chain(r.buffers()) {
            p.set_name(name);
        }
        r
    }
}

/// `inner + shortcut`, bringing both to one layout.
fn add(inner: Features, shortcut: Features, m: usize) -> Result<Features> {
    let (is, ss) = (inner.var.shape().to_vec(), shortcut.var.shape().to_vec());
    let mismatch = || Error::Shape {
        op: "residual",
        reason: format!(
            "inner output {is:?} ({:?}) and shortcut {ss:?} ({:?}) do not add up: give the residual a projection \
             that maps its input to the inner output's shape (a 1x1 conv with the inner stride for images, a \
             linear layer for dense features)",
            inner.layout, shortcut.layout
        ),
    };
    let mask = inner.mask.clone().or_else(|| shortcut.mask.clone());
    let (a, b) = (inner.layout, shortcut.layout);
    // The side that has the members first (addition commutes).
    let (p, q) = if b == Layout::Packed || (b == Layout::Members && a == Layout::Shared) {
        (&shortcut, &inner)
    } else {
        (&inner, &shortcut)
    };
    let (ps, qs) = (p.var.shape().to_vec(), q.var.shape().to_vec());
    let out = match (p.layout, q.layout) {
        (x, y) if x == y => {
            if ps != qs {
                return Err(mismatch());
            }
            Features::new(p.var.add(&q.var)?, x)
        }
        (Layout::Members, Layout::Shared) => {
            if ps.len() != qs.len() + 1 || ps[1..] != qs[..] {
                return Err(mismatch());
            }
            Features::members(p.var.add(&q.var)?)
        }
        (Layout::Packed, Layout::Shared) => {
            let fits = ps.len() == 4
                && qs.len() == 4
                && ps[0] == qs[0]
                && ps[2..] == qs[2..]
                && ps[1] == m * qs[1];
            if !fits {
                return Err(mismatch());
            }
            let (bt, c, h, w) = (qs[0], qs[1], qs[2], qs[3]);
            let v = p
                .var
                .reshape(&[bt, m, c, h, w])?
                .add(&q.var.reshape(&[bt, 1, c, h, w])?)?;
            Features::packed(v.reshape(&ps)?)
        }
        (Layout::Packed, Layout::Members) => {
            if qs.len() != 5 || qs[0] != m {
                return Err(mismatch());
            }
            let qp = q
                .var
                .swap_leading()?
                .reshape(&[qs[1], m * qs[2], qs[3], qs[4]])?;
            if qp.shape() != ps.as_slice() {
                return Err(mismatch());
            }
            Features::packed(p.var.add(&qp)?)
        }
        _ => return Err(mismatch()),
    };
    Ok(out.with_mask(mask))
}

impl Module for Residual {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let y = self.inner.forward(tape, x.clone())?;
        let shortcut = match &self.projection {
            Some(p) if p.takes_16bit() => p.forward(tape, x)?,
            Some(p) => p.forward(tape, x.in_f32()?)?,
            None => x,
        };
        // Both sides in one type: a 16-bit side meets an f32 one in f32.
        let (y, shortcut) = if y.var.value().dtype() == shortcut.var.value().dtype() {
            (y, shortcut)
        } else {
            (y.in_f32()?, shortcut.in_f32()?)
        };
        add(y, shortcut, self.members)
    }

    fn takes_16bit(&self) -> bool {
        true // its inner layers and projection are given what they take
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v: Vec<_> = self
            .inner
            .params()
            .into_iter()
            .map(|(n, p)| (format!("inner.{n}"), p))
            .collect();
        if let Some(proj) = &self.projection {
            v.extend(
                proj.params()
                    .into_iter()
                    .map(|(n, p)| (format!("projection.{n}"), p)),
            );
        }
        v
    }

    fn buffers(&self) -> Vec<(String, Param)> {
        let mut v: Vec<_> = self
            .inner
            .buffers()
            .into_iter()
            .map(|(n, p)| (format!("inner.{n}"), p))
            .collect();
        if let Some(proj) = &self.projection {
            v.extend(
                proj.buffers()
                    .into_iter()
                    .map(|(n, p)| (format!("projection.{n}"), p)),
            );
        }
        v
    }

    fn set_masks_drawn(&self, n: u64) {
        self.inner.set_masks_drawn(n);
    }

    fn kind(&self) -> &'static str {
        "residual"
    }
}

/// `{ residual = [LAYERS], act = "relu" }`: the layers' output added to their input, then the activation. When the
/// layers change the shape, the input goes through a projection: a 1x1 convolution with the layers' stride for
/// images, a dense layer for features.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResidualSpec {
    /// The inner layers.
    pub layers: Vec<LayerSpec>,
    /// The activation after the sum.
    pub act: Option<ActivationKind>,
}

/// How a residual's input is brought to its inner output's shape.
enum Projection {
    /// A 1x1 convolution from `from` to `to` channels with this stride.
    Conv {
        from: usize,
        to: usize,
        stride: usize,
    },
    /// A dense layer.
    Linear { from: usize, to: usize },
}

impl Projection {
    /// The projection from `input` to `output`, if the shapes allow one.
    fn between(input: &Shape, output: &Shape) -> Option<Projection> {
        match (input, output) {
            (
                &Shape::Image {
                    channels: c,
                    height: h,
                    width: w,
                },
                &Shape::Image {
                    channels: c2,
                    height: h2,
                    width: w2,
                },
            ) => (1..=h.max(w))
                .find(|s| (h - 1) / s + 1 == h2 && (w - 1) / s + 1 == w2)
                .map(|stride| Projection::Conv {
                    from: c,
                    to: c2,
                    stride,
                }),
            (Shape::Dense(a), Shape::Dense(b))
                if a.len() == b.len() && a[..a.len() - 1] == b[..b.len() - 1] =>
            {
                Some(Projection::Linear {
                    from: input.width(),
                    to: output.width(),
                })
            }
            _ => None,
        }
    }

    fn params(&self) -> usize {
        match *self {
            Projection::Conv { from, to, .. } | Projection::Linear { from, to } => from * to + to,
        }
    }
}

impl ResidualSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<ResidualSpec> {
        Ok(ResidualSpec {
            layers: read_layers(f, "residual")?,
            act: ActivationKind::read(f)?,
        })
    }

    /// The inner layers' shapes from `input`, as a sentence when one does not fit.
    fn shapes(&self, input: &Shape) -> std::result::Result<Vec<Shape>, String> {
        walk(&self.layers, input).map_err(|e| match e {
            Error::Spec {
                index,
                kind,
                reason,
            } => format!("its layer {index} ({kind}): {reason}"),
            other => other.to_string(),
        })
    }

    /// `None` when the shortcut is the input itself.
    fn projection(
        input: &Shape,
        output: &Shape,
    ) -> std::result::Result<Option<Projection>, String> {
        if input == output {
            return Ok(None);
        }
        Projection::between(input, output).map(Some).ok_or_else(|| {
            format!(
                "its layers turn {input} into {output}, which no projection of the input can match: a residual's \
                 layers must keep the shape, or change only the channels and the size by a stride (images), or the \
                 width (features)"
            )
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        let out = self.shapes(input)?.pop().expect("the input's shape");
        Self::projection(input, &out)?;
        Ok(out)
    }

    pub(crate) fn params(&self, input: &Shape) -> usize {
        let Ok(shapes) = self.shapes(input) else {
            return 0;
        };
        let inner: usize = self
            .layers
            .iter()
            .zip(&shapes)
            .map(|(l, s)| l.param_count(s))
            .sum();
        let out = shapes.last().expect("the input's shape");
        inner
            + Self::projection(input, out)
                .ok()
                .flatten()
                .map_or(0, |p| p.params())
    }

    /// Values the inner layers keep, and the sum.
    pub(crate) fn scratch(&self, input: &Shape) -> usize {
        self.shapes(input)
            .map_or(0, |shapes| activation_count(&self.layers, &shapes))
    }

    pub(crate) fn build(&self, input: &Shape, ctx: &LayerCtx<'_>) -> Result<Residual> {
        let shapes = self.shapes(input).map_err(|reason| Error::Shape {
            op: "residual",
            reason,
        })?;
        let inner = build_layers(&self.layers, &shapes, ctx)?;
        let out = shapes.last().expect("the input's shape");
        let proj = Self::projection(input, out).map_err(|reason| Error::Shape {
            op: "residual",
            reason,
        })?;
        let pctx = ctx.child(self.layers.len());
        let projection: Option<Box<dyn Module>> = match proj {
            None => None,
            Some(Projection::Conv { from, to, stride }) => Some(Box::new(Conv2d::new(
                from,
                to,
                1,
                stride,
                0,
                1.0,
                &pctx.seeds,
                pctx.dtype,
                pctx.device,
            )?)),
            Some(Projection::Linear { from, to }) => Some(Box::new(Linear::new(
                from,
                to,
                true,
                1.0,
                &pctx.seeds,
                pctx.dtype,
                pctx.device,
            )?)),
        };
        Ok(Residual::new(inner, projection, ctx.seeds.len()))
    }
}
