//! CUDA fused optimizer steps (`optim.cu`): one launch updates up to 24 parameter ranges, each
//! with one learning rate per member, so a whole model (or a fused cohort) steps in a few launches.

#[cfg(doc)]
use super::LossScaleState;
use super::{AdamParams, SgdParams};
use crate::cuda::{Gpu, Launch, kernel_args, sources::OPTIM as SRC};
use crate::{Error, Result};

const MT_MAX: usize = 24;
const MT_RATES: usize = 256;
const MT_CHUNK: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MtEntry {
    p: u64,
    g: u64,
    a: u64,
    b: u64,
    n: u64,
    per_member: u64,
    rate0: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MtTable {
    count: u32,
    pad: u32,
    block_start: [u64; MT_MAX + 1],
    e: [MtEntry; MT_MAX],
    rates: [f32; 2 * MT_RATES],
}

impl MtTable {
    fn new() -> Self {
        MtTable {
            count: 0,
            pad: 0,
            block_start: [0; MT_MAX + 1],
            e: [MtEntry::default(); MT_MAX],
            rates: [0.0; 2 * MT_RATES],
        }
    }
}

/// A captured optimizer step's state in device memory (`StepState` in `optim.cu`): the last
/// finished step, finished blocks of the running step (0 between steps), and the factor every
/// learning rate is scaled by.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepState {
    /// The last finished step (the next one runs as `last + 1`).
    pub last: u32,
    /// Blocks of the running step that finished; 0 between steps.
    pub blocks: u32,
    /// Factor on every learning rate.
    pub scale: f32,
    /// Padding to 16 bytes.
    pub pad: u32,
}

impl StepState {
    /// The state before step `next` (1-based), with rates scaled by `scale`.
    pub fn before(next: u64, scale: f32) -> StepState {
        StepState {
            last: u32::try_from(next.saturating_sub(1)).unwrap_or(u32::MAX),
            blocks: 0,
            scale,
            pad: 0,
        }
    }
}

/// The device buffers of one parameter: f32 `param` and `grad`, and the optimizer state
/// (`state1`: SGD's momentum buffer or Adam's m; `state2`: Adam's v), all `len` long.
#[derive(Clone, Copy, Debug)]
pub struct ParamBuffers<'a> {
    /// The parameter, updated in place.
    pub param: u64,
    /// Its gradient.
    pub grad: u64,
    /// Momentum buffer (SGD) or first moment (Adam); 0 when unused.
    pub state1: u64,
    /// Second moment (Adam); 0 when unused.
    pub state2: u64,
    /// Elements.
    pub len: usize,
    /// One learning rate, or one per member (`len` splits into `lrs.len()` equal parts).
    pub lrs: &'a [f64],
}

/// Packs ranges of members into launch tables; `rate` turns a learning rate into the kernel's
/// (first, second) per-member values. `launch` gets each table, its blocks, and whether it is
/// the last.
fn pack(
    params: &[ParamBuffers<'_>],
    rate: impl Fn(f64) -> (f32, f32),
    mut launch: impl FnMut(&MtTable, usize, bool) -> Result<()>,
) -> Result<()> {
    // A table launches once the next one is packed, so that the last one knows it is.
    let mut pending: Option<(MtTable, usize)> = None;
    pack_tables(params, rate, |t, blocks| {
        match pending.replace((*t, blocks)) {
            Some((prev, prev_blocks)) => launch(&prev, prev_blocks, false),
            None => Ok(()),
        }
    })?;
    pending.map_or(Ok(()), |(t, blocks)| launch(&t, blocks, true))
}

fn pack_tables(
    params: &[ParamBuffers<'_>],
    rate: impl Fn(f64) -> (f32, f32),
    mut emit: impl FnMut(&MtTable, usize) -> Result<()>,
) -> Result<()> {
    let mut t = MtTable::new();
    let mut blocks = 0usize;
    let mut rates_used = 0usize;
    let mut flush = |t: &mut MtTable, blocks: &mut usize, rates_used: &mut usize| {
        if t.count > 0 {
            t.block_start[t.count as usize] = *blocks as u64;
            emit(t, *blocks)?;
        }
        *t = MtTable::new();
        *blocks = 0;
        *rates_used = 0;
        Ok(())
    };
    for pb in params {
        if pb.len == 0 {
            continue;
        }
        let members = pb.lrs.len();
        if members == 0 || pb.len % members != 0 {
            return Err(Error::Cuda(format!(
                "optimizer step: {} learning rates do not split {} elements into equal members",
                members, pb.len
            )));
        }
        let per = pb.len / members;
        let mut m0 = 0;
        while m0 < members {
            if t.count as usize == MT_MAX || rates_used == MT_RATES {
                flush(&mut t, &mut blocks, &mut rates_used)?;
            }
            let take = (members - m0).min(MT_RATES - rates_used);
            let off = (m0 * per * 4) as u64;
            let n = take * per;
            let k = t.count as usize;
            let at = |ptr: u64| if ptr == 0 { 0 } else { ptr + off };
            t.e[k] = MtEntry {
                p: at(pb.param),
                g: at(pb.grad),
                a: at(pb.state1),
                b: at(pb.state2),
                n: n as u64,
                per_member: per as u64,
                rate0: rates_used as u32,
                pad: 0,
            };
            for (j, &lr) in pb.lrs[m0..m0 + take].iter().enumerate() {
                let (x, y) = rate(lr);
                t.rates[2 * (rates_used + j)] = x;
                t.rates[2 * (rates_used + j) + 1] = y;
            }
            t.block_start[k] = blocks as u64;
            blocks += n.div_ceil(MT_CHUNK);
            t.count += 1;
            rates_used += take;
            m0 += take;
        }
    }
    flush(&mut t, &mut blocks, &mut rates_used)
}

fn table_launch(blocks: usize) -> Result<Launch> {
    let grid = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| {
            Error::Cuda(format!(
                "optimizer step: {blocks} blocks exceed the grid limit"
            ))
        })?;
    Ok(Launch {
        grid: (grid, 1, 1),
        block: (256, 1, 1),
        shared: 0,
    })
}

/// One SGD step over every parameter in `params` (PyTorch semantics, zero-initialised momentum
/// buffer, as in `cpu::sgd_step`); `h.lrs` is ignored in favour of each parameter's own `lrs`.
/// With a `state` (a step captured into a CUDA graph), the rates are scaled by the [`StepState`]
/// there, which the host sets before each replay. With a `skip`, nothing is updated where the
/// f32 it addresses is non-zero when the step runs (a [`LossScaleState`]'s overflow flag).
///
/// # Safety
/// Each [`ParamBuffers`] must describe live f32 buffers of `len` elements on this device
/// (`state1` too when `h.momentum != 0`); `state` must address a [`StepState`] and `skip` an f32
/// on this device that live as long as the queued (or captured) work.
///
/// # Errors
/// Rates that do not split a parameter evenly, a missing momentum buffer, or a launch failure.
pub unsafe fn sgd_step(
    gpu: &Gpu,
    params: &[ParamBuffers<'_>],
    h: &SgdParams<'_>,
    state: Option<u64>,
    skip: Option<u64>,
) -> Result<()> {
    let (state, skip) = (state.unwrap_or(0), skip.unwrap_or(0));
    let use_buf: u32 = u32::from(h.momentum != 0.0);
    if use_buf == 1 && params.iter().any(|p| p.state1 == 0 && p.len > 0) {
        return Err(Error::Cuda(
            "sgd_step: momentum needs a momentum buffer for every parameter".into(),
        ));
    }
    let wd = h.weight_decay as f32;
    let mom = h.momentum as f32;
    let damp = (1.0 - h.dampening) as f32;
    let nesterov = u32::from(h.nesterov);
    pack(
        params,
        |lr| (lr as f32, 0.0),
        |t, blocks, _| {
            let table = *t;
            let mut args = kernel_args![table, wd, mom, damp, nesterov, use_buf, state, skip];
            // SAFETY: matches `sgd_f32(MtTable, float, float, float, u32, u32, StepState*,
            // float*)`; buffers per the caller.
            unsafe { gpu.launch(&SRC, "sgd_f32", table_launch(blocks)?, &mut args) }
        },
    )
}

/// One Adam / AdamW step over every parameter in `params` (PyTorch semantics, as in
/// `cpu::adam_step`); `h.lrs` is ignored in favour of each parameter's own `lrs`. With a `state`
/// (a step captured into a CUDA graph), the step runs as `state.last + 1` with its rates scaled by
/// `state.scale`, and then advances `state.last` by one: each replay applies the next step's bias
/// correction, and the host sets the state where it knows better (eager steps in between, a
/// learning-rate schedule). `h.step` is used only without a state. With a `skip`, as in
/// [`sgd_step`] (a skipped step still advances a state's step).
///
/// # Safety
/// Each [`ParamBuffers`] must describe live f32 buffers of `len` elements on this device, with
/// `state1` (m) and `state2` (v); `state` must address a [`StepState`] and `skip` an f32 on this
/// device that live as long as the queued (or captured) work.
///
/// # Errors
/// Rates that do not split a parameter evenly, missing moments, or a launch failure.
pub unsafe fn adam_step(
    gpu: &Gpu,
    params: &[ParamBuffers<'_>],
    h: &AdamParams<'_>,
    state: Option<u64>,
    skip: Option<u64>,
) -> Result<()> {
    let skip = skip.unwrap_or(0);
    if params
        .iter()
        .any(|p| (p.state1 == 0 || p.state2 == 0) && p.len > 0)
    {
        return Err(Error::Cuda(
            "adam_step: every parameter needs both moment buffers".into(),
        ));
    }
    let step = h.step.max(1);
    let (bc1, bc2) = (
        super::bias_correction(h.beta1, step),
        super::bias_correction(h.beta2, step),
    );
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let (one_b1, one_b2) = ((1.0 - h.beta1) as f32, (1.0 - h.beta2) as f32);
    let eps = h.eps as f32;
    let (inv_bc1, inv_sqrt_bc2) = ((1.0 / bc1) as f32, (1.0 / bc2.sqrt()) as f32);
    let l2 = if h.decoupled {
        0.0
    } else {
        h.weight_decay as f32
    };
    let decay = if h.decoupled { h.weight_decay } else { 0.0 };
    pack(
        params,
        |lr| (lr as f32, (lr * decay) as f32),
        |t, blocks, last| {
            let table = *t;
            let cfg = table_launch(blocks)?;
            match state {
                None => {
                    let mut args = kernel_args![
                        table,
                        b1,
                        b2,
                        one_b1,
                        one_b2,
                        eps,
                        inv_sqrt_bc2,
                        inv_bc1,
                        l2,
                        skip
                    ];
                    // SAFETY: matches `adam_f32(MtTable, float x8, float*)`; buffers per the caller.
                    unsafe { gpu.launch(&SRC, "adam_f32", cfg, &mut args) }
                }
                Some(state) => {
                    let advance = u32::from(last);
                    let (beta1, beta2) = (h.beta1, h.beta2);
                    let mut args = kernel_args![
                        table, b1, b2, one_b1, one_b2, eps, l2, beta1, beta2, state, advance, skip
                    ];
                    // SAFETY: matches `adam_f32_counted(MtTable, float x6, double x2, StepState*,
                    // u32, float*)`; buffers per the caller.
                    unsafe { gpu.launch(&SRC, "adam_f32_counted", cfg, &mut args) }
                }
            }
        },
    )
}

/// Divides each gradient (live f32 buffers `(address, len)`) by the scale in the [`LossScaleState`]
/// at `state`, raising its overflow flag where any quotient is not finite; one launch for up to
/// `MT_MAX` gradients.
///
/// # Safety
/// Every `(address, len)` must be a live f32 buffer of `len` elements on this device and `state`
/// a [`LossScaleState`] there, living as long as the queued (or captured) work.
///
/// # Errors
/// A launch failure.
pub unsafe fn unscale(gpu: &Gpu, grads: &[(u64, usize)], state: u64) -> Result<()> {
    // A table entry per gradient: its `p`, one range, the rate table unused.
    let entries: Vec<_> = grads
        .iter()
        .map(|&(grad, len)| ParamBuffers {
            param: grad,
            grad: 0,
            state1: 0,
            state2: 0,
            len,
            lrs: &[0.0],
        })
        .collect();
    pack(
        &entries,
        |_| (0.0, 0.0),
        |t, blocks, _| {
            let table = *t;
            let mut args = kernel_args![table, state];
            // SAFETY: matches `unscale_f32(MtTable, float*)`; buffers per the caller.
            unsafe { gpu.launch(&SRC, "unscale_f32", table_launch(blocks)?, &mut args) }
        },
    )
}

/// Moves the [`LossScaleState`] at `state` on after a step: an overflow halves the scale (not below
/// `min_scale`) and counts a skipped step, `interval` clean steps in a row double it (not above
/// `max_scale`); the overflow flag clears (as [`super::cpu::update_scale`]).
///
/// # Safety
/// `state` must address a [`LossScaleState`] on this device that lives as long as the queued (or
/// captured) work.
///
/// # Errors
/// A launch failure.
pub unsafe fn update_scale(
    gpu: &Gpu,
    state: u64,
    interval: u64,
    min_scale: f32,
    max_scale: f32,
) -> Result<()> {
    let interval = interval as f32;
    let mut args = kernel_args![state, interval, min_scale, max_scale];
    let one = Launch {
        grid: (1, 1, 1),
        block: (1, 1, 1),
        shared: 0,
    };
    // SAFETY: matches `update_scale_f32(float*, float, float, float)`; the state per the caller.
    unsafe { gpu.launch(&SRC, "update_scale_f32", one, &mut args) }
}
