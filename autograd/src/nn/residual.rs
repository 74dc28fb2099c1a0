use super::{Features, Layout, Module, Sequential};
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
            Some(p) => p.forward(tape, x)?,
            None => x,
        };
        add(y, shortcut, self.members)
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

    fn kind(&self) -> &'static str {
        "residual"
    }
}
