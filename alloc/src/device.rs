//! One allocator per device, chosen from a [`Config`].

use crate::bfc::Bfc;
use crate::config::{Backend, Config, DeviceSelector};
use crate::cuda::{CudaAsyncPool, CudaMemory, CudaVmm, cuda_available};
use crate::error::Result;
use crate::host::HostMemory;
use crate::source::MemorySource;

/// An allocator over whichever source the configuration asks for.
pub type DeviceBfc = Bfc<Box<dyn MemorySource>>;

/// The device a selector names on this machine: `Auto` is `cuda:0` when a driver and a GPU are found, else `Cpu`.
pub fn resolve_device(device: DeviceSelector) -> DeviceSelector {
    match device {
        DeviceSelector::Auto if cuda_available() => DeviceSelector::Cuda(0),
        DeviceSelector::Auto => DeviceSelector::Cpu,
        d => d,
    }
}

/// The allocator for `config.device` (resolved by [`resolve_device`]) and `config.backend`:
/// host memory for the CPU; on a GPU, `bfc` is the stitched source ([`CudaVmm`]; `cuMemAlloc` segments where the
/// device has no virtual memory management), `async` the driver's pool, `direct` plain `cuMemAlloc`.
///
/// The stitched source made here knows no stream, so a page it moves waits for the device; a runtime that frees
/// blocks in the order of one stream should use `stream_allocator` (feature `cuda`).
///
/// # Errors
/// [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda) or
/// [`Error::NoCudaDevice`](crate::Error::NoCudaDevice) when a GPU is asked for and there is none.
pub fn device_allocator(config: &Config) -> Result<DeviceBfc> {
    let source: Box<dyn MemorySource> = match resolve_device(config.device) {
        DeviceSelector::Cpu | DeviceSelector::Auto => Box::new(HostMemory::new()),
        DeviceSelector::Cuda(n) => match config.backend {
            Backend::Bfc => stitched_or_segments(CudaVmm::new(n), n)?,
            Backend::Async => Box::new(CudaAsyncPool::new(n, config.release_threshold)?),
            Backend::Direct => Box::new(CudaMemory::new(n)?),
        },
    };
    Bfc::new(source, config.clone())
}

/// The allocator of `stream`'s device for blocks used and freed in that stream's order (a runtime's compute
/// stream): under the `bfc` backend the stitched source records each page's last use as an event on the stream
/// and moves a page without waiting once the stream has passed it. Other backends are as [`device_allocator`]
/// makes them; `config.device` is the stream's device.
///
/// # Errors
/// As [`device_allocator`].
#[cfg(feature = "cuda")]
pub fn stream_allocator(
    config: &Config,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
) -> Result<DeviceBfc> {
    let n = stream.context().ordinal();
    let config = Config {
        device: DeviceSelector::Cuda(n),
        ..config.clone()
    };
    if config.backend != Backend::Bfc {
        return device_allocator(&config);
    }
    let source = stitched_or_segments(CudaVmm::with_stream(stream), n)?;
    Bfc::new(source, config)
}

/// The stitched source, or `cuMemAlloc` segments where the device cannot map pages.
fn stitched_or_segments(vmm: Result<CudaVmm>, n: usize) -> Result<Box<dyn MemorySource>> {
    match vmm {
        Ok(vmm) => Ok(Box::new(vmm)),
        Err(e @ crate::Error::NotCompiledWithCuda { .. })
        | Err(e @ crate::Error::NoCudaDevice { .. }) => Err(e),
        Err(e) => {
            tracing::warn!("stitched source unavailable ({e}); using cuMemAlloc segments");
            Ok(Box::new(CudaMemory::new(n)?))
        }
    }
}
