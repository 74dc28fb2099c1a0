//! What the GPU integration tests share: random operands, copies to and from the device, and the comparison with
//! the CPU kernels' values.
// Each test crate compiles this module and uses a part of it.
#![allow(dead_code)]

use cohort_kernels::cuda::{DeviceBuffer, Gpu};

/// Values in [-1, 1) (xorshift).
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `data` in a buffer of its own on `g` (at least one byte).
pub fn up<T: bytemuck::Pod>(g: &Gpu, data: &[T]) -> DeviceBuffer {
    let buf = g.alloc(std::mem::size_of_val(data).max(1)).unwrap();
    // SAFETY: the buffer holds these bytes.
    unsafe { g.htod(buf.ptr(), bytemuck::cast_slice(data)).unwrap() };
    buf
}

/// The first `n` f32 of `buf`.
pub fn down(g: &Gpu, buf: &DeviceBuffer, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: callers size the buffer for n f32.
    unsafe {
        g.dtoh(buf.ptr(), bytemuck::cast_slice_mut(&mut out))
            .unwrap()
    };
    out
}

/// Within 1e-4 of the largest magnitude of `want` (cuDNN's algorithms and the own tiles add in other orders than
/// the CPU does); a NaN never is (outputs start as NaN).
#[track_caller]
pub fn assert_near(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}: element {i}: got {g}, want {w} (largest {scale})"
        );
    }
}
