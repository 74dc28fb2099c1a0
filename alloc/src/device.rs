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
/// # Errors
/// [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda) or
/// [`Error::NoCudaDevice`](crate::Error::NoCudaDevice) when a GPU is asked for and there is none.
pub fn device_allocator(config: &Config) -> Result<DeviceBfc> {
    let source: Box<dyn MemorySource> = match resolve_device(config.device) {
        DeviceSelector::Cpu | DeviceSelector::Auto => Box::new(HostMemory::new()),
        DeviceSelector::Cuda(n) => match config.backend {
            Backend::Bfc => match CudaVmm::new(n) {
                Ok(vmm) => Box::new(vmm),
                Err(e @ crate::Error::NotCompiledWithCuda { .. })
                | Err(e @ crate::Error::NoCudaDevice { .. }) => {
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!("stitched source unavailable ({e}); using cuMemAlloc segments");
                    Box::new(CudaMemory::new(n)?)
                }
            },
            Backend::Async => Box::new(CudaAsyncPool::new(n, config.release_threshold)?),
            Backend::Direct => Box::new(CudaMemory::new(n)?),
        },
    };
    Bfc::new(source, config.clone())
}
