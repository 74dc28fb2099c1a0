use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Device {
    /// Host memory; kernels run on rayon threads.
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// `Cuda(0)` when a CUDA driver and at least one GPU are found, else `Cpu`. Never panics.
    pub fn best() -> Device {
        match crate::cuda::device_count() {
            Ok(n) if n > 0 => Device::Cuda(0),
            _ => Device::Cpu,
        }
    }

    /// Parses `"cpu"`, `"cuda"` (= `cuda:0`), `"cuda:N"` or `"auto"` (= [`Device::best`]).
    ///
    /// # Errors
    /// [`Error::ParseDevice`] for anything else. Does not check that the GPU exists.
    pub fn parse(s: &str) -> Result<Device> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            "auto" => Ok(Device::best()),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| Error::ParseDevice(s.to_string())),
        }
    }

    /// The device itself when it exists on this machine (the CPU always does).
    ///
    /// # Errors
    /// [`Error::DeviceUnavailable`] for a GPU the driver does not see, with how many it sees.
    pub fn verify(self) -> Result<Device> {
        let Device::Cuda(n) = self else {
            return Ok(self);
        };
        let count = crate::cuda::device_count().unwrap_or(0);
        if n < count {
            return Ok(self);
        }
        let reason = match count {
            0 => "this machine has no usable CUDA GPU (no driver, or none visible through CUDA_VISIBLE_DEVICES): \
                  use \"cpu\" or \"auto\""
                .to_string(),
            _ => format!("the driver sees {count} GPU(s), cuda:0 to cuda:{}", count - 1),
        };
        Err(Error::DeviceUnavailable {
            device: self,
            reason,
        })
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// Opens the device now rather than at its first use (a no-op on the CPU): on CUDA its context, and the kernel
    /// modules nearly every job uses start compiling in the background, so that a machine's first run compiles them
    /// while it loads its data.
    ///
    /// # Errors
    /// When the device is unavailable.
    pub fn open(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(n) => crate::cuda::open(*n),
        }
    }

    /// Waits until all work queued on the device has finished (a no-op on the CPU).
    ///
    /// # Errors
    /// When the device is unavailable or the driver reports a failure.
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(n) => crate::cuda::synchronize(*n),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Device::parse(s)
    }
}
