//! CUDA memory sources: segments from `cuMemAlloc` ([`CudaMemory`]), the stitched virtual range of 2 MiB physical
//! pages ([`CudaVmm`]), and the driver's stream-ordered pool ([`CudaAsyncPool`]).
//!
//! Built only with the `cuda` feature; without it the types exist and their constructors return
//! [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda). The driver is found at run time: on a
//! machine without one, constructors return [`Error::NoCudaDevice`](crate::Error::NoCudaDevice).

#[cfg(feature = "cuda")]
pub use imp::*;
#[cfg(not(feature = "cuda"))]
pub use stub::*;

#[cfg(feature = "cuda")]
mod imp {
    use std::collections::{HashMap, VecDeque};
    use std::sync::Arc;

    use cudarc::driver::sys::{self, CUresult};
    use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};

    use crate::error::{Error, Result};
    use crate::source::{MemorySource, PagedMemory, Region, SourceError};

    fn what(ordinal: usize) -> String {
        format!("cuda:{ordinal}")
    }

    /// True when the CUDA driver library loads and reports at least one device.
    pub fn cuda_available() -> bool {
        // SAFETY: only tries to load the driver library; no driver call is made.
        let present = unsafe { sys::is_culib_present() };
        present && CudaContext::device_count().is_ok_and(|n| n > 0)
    }

    /// The primary context of device `ordinal`, with a clear error where there is no driver or no such device.
    ///
    /// # Errors
    /// [`Error::NoCudaDevice`].
    pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>> {
        // SAFETY: only tries to load the driver library; no driver call is made.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoCudaDevice {
                what: what(ordinal),
                detail: "the CUDA driver library (libcuda.so) was not found".into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoCudaDevice {
            what: what(ordinal),
            detail: format!("cuDeviceGetCount failed: {e:?}"),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoCudaDevice {
                what: what(ordinal),
                detail: format!("the driver sees {count} device(s)"),
            });
        }
        CudaContext::new(ordinal).map_err(|e| Error::NoCudaDevice {
            what: what(ordinal),
            detail: format!("creating its context failed: {e:?}"),
        })
    }

    fn failed(name: &str, call: &'static str, detail: String) -> SourceError {
        SourceError::Failed(Error::Source {
            source_name: name.to_string(),
            call,
            detail,
        })
    }

    /// Maps a driver result: out of memory apart, everything else a failure naming the call.
    fn check(
        r: CUresult,
        name: &str,
        call: &'static str,
        bytes: u64,
    ) -> std::result::Result<(), SourceError> {
        match r {
            CUresult::CUDA_SUCCESS => Ok(()),
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(SourceError::OutOfMemory { requested: bytes })
            }
            other => Err(failed(name, call, format!("{other:?}"))),
        }
    }

    fn bind(ctx: &CudaContext, name: &str) -> std::result::Result<(), SourceError> {
        ctx.bind_to_thread()
            .map_err(|e: DriverError| failed(name, "cuCtxSetCurrent", format!("{e:?}")))
    }

    fn capacity(ctx: &CudaContext) -> u64 {
        ctx.total_mem().map_or(0, |b| b as u64)
    }

    fn device_free(ctx: &CudaContext) -> u64 {
        ctx.mem_get_info().map_or(0, |(free, _)| free as u64)
    }

    /// Segments from `cuMemAlloc` / `cuMemFree` (the portable fallback); frees what is left when dropped. A release
    /// (trim, or every free under the direct backend) first synchronizes the context, since queued work may still
    /// use a block freed in stream order.
    #[derive(Debug)]
    pub struct CudaMemory {
        ctx: Arc<CudaContext>,
        name: String,
        regions: HashMap<u64, u64>,
    }

    impl CudaMemory {
        /// Segments on device `ordinal` (its primary context, shared with everything else in the process).
        ///
        /// # Errors
        /// [`Error::NoCudaDevice`] without a driver or such a device.
        pub fn new(ordinal: usize) -> Result<Self> {
            Ok(Self::with_context(cuda_context(ordinal)?))
        }

        /// Segments in the given context.
        pub fn with_context(ctx: Arc<CudaContext>) -> Self {
            Self {
                name: what(ctx.ordinal()),
                ctx,
                regions: HashMap::new(),
            }
        }

        /// The context.
        pub fn context(&self) -> &Arc<CudaContext> {
            &self.ctx
        }
    }

    impl MemorySource for CudaMemory {
        fn name(&self) -> String {
            self.name.clone()
        }
        fn capacity(&self) -> u64 {
            capacity(&self.ctx)
        }
        fn device_free(&self) -> u64 {
            device_free(&self.ctx)
        }
        fn reserve(&mut self, bytes: u64) -> std::result::Result<Region, SourceError> {
            bind(&self.ctx, &self.name)?;
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the context is current; `ptr` is a valid out-pointer.
            let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) };
            check(r, &self.name, "cuMemAlloc", bytes)?;
            self.regions.insert(ptr, bytes);
            Ok(Region {
                base: ptr,
                size: bytes,
            })
        }
        fn release(&mut self, region: Region) -> std::result::Result<(), SourceError> {
            if self.regions.get(&region.base) != Some(&region.size) {
                return Err(failed(
                    &self.name,
                    "cuMemFree",
                    format!("region {:#x} was never reserved", region.base),
                ));
            }
            bind(&self.ctx, &self.name)?;
            // Blocks are freed in stream order: wait for queued work that may still use the region.
            self.ctx
                .synchronize()
                .map_err(|e| failed(&self.name, "cuCtxSynchronize", format!("{e:?}")))?;
            // SAFETY: `base` was returned by cuMemAlloc in this context and is freed once (removed below).
            let r = unsafe { sys::cuMemFree_v2(region.base) };
            check(r, &self.name, "cuMemFree", region.size)?;
            self.regions.remove(&region.base);
            Ok(())
        }
    }

    impl Drop for CudaMemory {
        fn drop(&mut self) {
            if self.ctx.bind_to_thread().is_err() {
                return;
            }
            for (base, _) in self.regions.drain() {
                // SAFETY: every entry came from cuMemAlloc in this context and is freed once (drained).
                let _ = unsafe { sys::cuMemFree_v2(base) };
            }
        }
    }

    /// The stitched source: one reserved virtual range (twice the device memory), physical pages created with
    /// `cuMemCreate` and mapped with `cuMemMap` where blocks are, moved between virtual pages by unmap + map, access
    /// granted with one `cuMemSetAccess` per contiguous run. `reserve`/`release` fall back to `cuMemAlloc` segments.
    ///
    /// Blocks are freed in stream order, so work queued before a free may still touch an idle page. A moved
    /// physical page is mapped at its new page at once (work using it there is queued later) and stays mapped at its
    /// old page, which the allocator unmaps (as it trims a page) only once the stream has passed a point recorded
    /// after its last block was freed: on the stream given to [`with_stream`](Self::with_stream) a point is an event (`cuEventRecord`, asked
    /// with `cuEventQuery`, waited for with `cuEventSynchronize`). A source made without a stream cannot see the
    /// blocks' stream, so its points pass only when it waits for one, by synchronizing the context.
    #[derive(Debug)]
    pub struct CudaVmm {
        segments: CudaMemory,
        ordinal: i32,
        page: u64,
        range: Option<Region>,
        /// Virtual page → the physical page mapped there.
        handles: HashMap<u64, sys::CUmemGenericAllocationHandle>,
        /// Physical page → how many virtual pages map it (a moved page stays mapped at its old page for a while).
        mappings: HashMap<sys::CUmemGenericAllocationHandle, u32>,
        points: StreamPoints,
    }

    /// The points recorded on the blocks' stream and how far it has got.
    #[derive(Debug, Default)]
    struct StreamPoints {
        stream: Option<Arc<CudaStream>>,
        /// Points recorded and not yet seen passed, oldest first, numbered `passed + 1 ..= recorded`.
        events: VecDeque<CudaEvent>,
        /// Events whose point passed, for reuse (creating one costs a driver call).
        spare: Vec<CudaEvent>,
        recorded: u64,
        passed: u64,
    }

    impl CudaVmm {
        /// The stitched source on device `ordinal`.
        ///
        /// # Errors
        /// [`Error::NoCudaDevice`] without a driver or device; [`Error::Source`] when the device does not support
        /// virtual memory management.
        pub fn new(ordinal: usize) -> Result<Self> {
            Self::with_context(cuda_context(ordinal)?)
        }

        /// The stitched source for blocks used and freed in the order of `stream` (the compute stream): a page's
        /// last use is an event recorded on it, and a page is moved without waiting once the event has completed.
        ///
        /// # Errors
        /// [`Error::Source`] when the device does not support virtual memory management.
        pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
            let mut vmm = Self::with_context(stream.context().clone())?;
            vmm.points.stream = Some(stream);
            Ok(vmm)
        }

        /// The stitched source in the given context, with no stream known: a page is moved or released only
        /// after the context is synchronized. Prefer [`with_stream`](Self::with_stream).
        ///
        /// # Errors
        /// [`Error::Source`] when the device does not support virtual memory management.
        pub fn with_context(ctx: Arc<CudaContext>) -> Result<Self> {
            let name = what(ctx.ordinal());
            let supported = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)
                .unwrap_or(0);
            if supported == 0 {
                return Err(Error::Source {
                    source_name: name,
                    call: "cuDeviceGetAttribute",
                    detail: "the device does not support virtual memory management; use CudaMemory"
                        .into(),
                });
            }
            let ordinal = ctx.ordinal() as i32;
            let mut vmm = Self {
                segments: CudaMemory::with_context(ctx),
                ordinal,
                page: 2 << 20,
                range: None,
                handles: HashMap::new(),
                mappings: HashMap::new(),
                points: StreamPoints::default(),
            };
            let prop = vmm.prop();
            let mut gran = 0usize;
            bind(&vmm.segments.ctx, &name).map_err(|e| crate::bfc::source_error(e, "bind"))?;
            // SAFETY: the context is current; `gran` and `prop` are valid for the call.
            let r = unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            };
            check(r, &name, "cuMemGetAllocationGranularity", 0)
                .map_err(|e| crate::bfc::source_error(e, "granularity"))?;
            if gran > 0 {
                vmm.page = (gran as u64).max(2 << 20).next_multiple_of(gran as u64);
            }
            Ok(vmm)
        }

        fn prop(&self) -> sys::CUmemAllocationProp {
            sys::CUmemAllocationProp {
                type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
                requestedHandleTypes: sys::CUmemAllocationHandleType(0),
                location: self.location(),
                win32HandleMetaData: std::ptr::null_mut(),
                allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                    compressionType: 0,
                    gpuDirectRDMACapable: 0,
                    usage: 0,
                    reserved: [0; 4],
                },
            }
        }

        fn location(&self) -> sys::CUmemLocation {
            sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal,
            }
        }

        fn set_access(&self, va: u64, bytes: u64) -> std::result::Result<(), SourceError> {
            let desc = sys::CUmemAccessDesc {
                location: self.location(),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `va..va+bytes` is mapped in this context's reserved range; `desc` is valid for the call.
            let r = unsafe { sys::cuMemSetAccess(va, bytes as usize, &desc, 1) };
            check(r, &self.segments.name, "cuMemSetAccess", bytes)
        }

        fn map_one(
            &self,
            va: u64,
            handle: sys::CUmemGenericAllocationHandle,
        ) -> std::result::Result<(), SourceError> {
            // SAFETY: `va` is a page of the reserved range with nothing mapped; `handle` is a live physical page.
            let r = unsafe { sys::cuMemMap(va, self.page as usize, 0, handle, 0) };
            check(r, &self.segments.name, "cuMemMap", self.page)
        }

        fn unmap_one(&self, va: u64) -> std::result::Result<(), SourceError> {
            // SAFETY: `va` is a mapped page of the reserved range (tracked in `handles`).
            let r = unsafe { sys::cuMemUnmap(va, self.page as usize) };
            check(r, &self.segments.name, "cuMemUnmap", self.page)
        }

        /// Unmaps one page; its physical page is released with its last mapping.
        fn unmap_page(&mut self, va: u64) -> std::result::Result<(), SourceError> {
            let Some(h) = self.handles.remove(&va) else {
                return Err(failed(
                    &self.segments.name,
                    "cuMemUnmap",
                    format!("page {va:#x} is not mapped"),
                ));
            };
            if let Err(e) = self.unmap_one(va) {
                self.handles.insert(va, h);
                return Err(e);
            }
            let n = self.mappings.entry(h).or_insert(1);
            *n -= 1;
            if *n == 0 {
                self.mappings.remove(&h);
                // SAFETY: `h` is mapped nowhere now and released once (its count removed).
                let r = unsafe { sys::cuMemRelease(h) };
                check(r, &self.segments.name, "cuMemRelease", self.page)?;
            }
            Ok(())
        }

        /// Undoes the first `done` pages of a failed `map`: created pages are released, moved ones stay mapped
        /// at their old pages.
        fn rollback(&mut self, va: u64, done: u64) {
            for i in 0..done {
                let _ = self.unmap_page(va + i * self.page);
            }
        }
    }

    impl MemorySource for CudaVmm {
        fn name(&self) -> String {
            format!("{} (stitched)", self.segments.name)
        }
        fn capacity(&self) -> u64 {
            self.segments.capacity()
        }
        fn device_free(&self) -> u64 {
            self.segments.device_free()
        }
        fn reserve(&mut self, bytes: u64) -> std::result::Result<Region, SourceError> {
            self.segments.reserve(bytes)
        }
        fn release(&mut self, region: Region) -> std::result::Result<(), SourceError> {
            self.segments.release(region)
        }
        fn paged(&mut self) -> Option<&mut dyn PagedMemory> {
            Some(self)
        }
    }

    impl PagedMemory for CudaVmm {
        fn page_size(&self) -> u64 {
            self.page
        }

        fn virtual_range(&mut self) -> std::result::Result<Region, SourceError> {
            if let Some(r) = self.range {
                return Ok(r);
            }
            bind(&self.segments.ctx, &self.segments.name)?;
            let size = (self.segments.capacity().max(self.page) * 2).next_multiple_of(self.page);
            let mut base: sys::CUdeviceptr = 0;
            // SAFETY: the context is current; `base` is a valid out-pointer.
            let r = unsafe {
                sys::cuMemAddressReserve(&mut base, size as usize, self.page as usize, 0, 0)
            };
            check(r, &self.segments.name, "cuMemAddressReserve", size)?;
            let region = Region { base, size };
            self.range = Some(region);
            Ok(region)
        }

        fn map(
            &mut self,
            va: u64,
            pages: u64,
            moved_from: &[u64],
        ) -> std::result::Result<(), SourceError> {
            bind(&self.segments.ctx, &self.segments.name)?;
            let prop = self.prop();
            for i in 0..pages {
                let target = va + i * self.page;
                let (handle, created) = match moved_from.get(i as usize) {
                    // The page stays mapped at `from` too: queued work may still use it there.
                    Some(from) => match self.handles.get(from) {
                        Some(&h) => (h, false),
                        None => {
                            self.rollback(va, i);
                            return Err(failed(
                                &self.segments.name,
                                "cuMemMap",
                                format!("moving page {from:#x}, which is not mapped"),
                            ));
                        }
                    },
                    None => {
                        let mut h: sys::CUmemGenericAllocationHandle = 0;
                        // SAFETY: the context is current; `h` and `prop` are valid for the call.
                        let r = unsafe { sys::cuMemCreate(&mut h, self.page as usize, &prop, 0) };
                        if let Err(e) = check(r, &self.segments.name, "cuMemCreate", self.page) {
                            self.rollback(va, i);
                            return Err(e);
                        }
                        (h, true)
                    }
                };
                if let Err(e) = self.map_one(target, handle) {
                    if created {
                        // SAFETY: `handle` was just created and is mapped nowhere.
                        let _ = unsafe { sys::cuMemRelease(handle) };
                    }
                    self.rollback(va, i);
                    return Err(e);
                }
                self.handles.insert(target, handle);
                *self.mappings.entry(handle).or_insert(0) += 1;
            }
            if let Err(e) = self.set_access(va, pages * self.page) {
                self.rollback(va, pages);
                return Err(e);
            }
            Ok(())
        }

        fn unmap(&mut self, va: u64, pages: u64) -> std::result::Result<(), SourceError> {
            bind(&self.segments.ctx, &self.segments.name)?;
            for i in 0..pages {
                self.unmap_page(va + i * self.page)?;
            }
            Ok(())
        }

        fn record_point(&mut self) -> std::result::Result<u64, SourceError> {
            let name = &self.segments.name;
            let p = &mut self.points;
            if let Some(stream) = &p.stream {
                let event = match p.spare.pop() {
                    Some(e) => e,
                    None => stream
                        .context()
                        .new_event(None)
                        .map_err(|e| failed(name, "cuEventCreate", format!("{e:?}")))?,
                };
                event
                    .record(stream)
                    .map_err(|e| failed(name, "cuEventRecord", format!("{e:?}")))?;
                p.events.push_back(event);
            }
            p.recorded += 1;
            Ok(p.recorded)
        }

        fn passed_point(&mut self) -> u64 {
            let p = &mut self.points;
            if p.stream.is_none() || self.segments.ctx.bind_to_thread().is_err() {
                return p.passed;
            }
            while let Some(event) = p.events.front() {
                // SAFETY: the event is live (owned here) and belongs to the current context.
                match unsafe { sys::cuEventQuery(event.cu_event()) } {
                    CUresult::CUDA_SUCCESS => {}
                    CUresult::CUDA_ERROR_NOT_READY => break,
                    other => {
                        // Not passed as far as the allocator can tell; waiting for it reports the error.
                        tracing::warn!("{}: cuEventQuery: {other:?}", self.segments.name);
                        break;
                    }
                }
                if let Some(e) = p.events.pop_front() {
                    p.spare.push(e);
                }
                p.passed += 1;
            }
            p.passed
        }

        fn wait_point(&mut self, point: u64) -> std::result::Result<(), SourceError> {
            let name = &self.segments.name;
            let p = &mut self.points;
            if point > p.recorded {
                return Err(failed(
                    name,
                    "cuEventSynchronize",
                    format!("point {point} was never recorded ({} were)", p.recorded),
                ));
            }
            if point <= p.passed {
                return Ok(());
            }
            if p.stream.is_none() {
                self.segments
                    .ctx
                    .synchronize()
                    .map_err(|e| failed(name, "cuCtxSynchronize", format!("{e:?}")))?;
                p.passed = p.recorded;
                return Ok(());
            }
            let at = (point - p.passed - 1) as usize;
            p.events[at]
                .synchronize()
                .map_err(|e| failed(name, "cuEventSynchronize", format!("{e:?}")))?;
            // Points complete in order: every one up to `point` has passed.
            p.spare.extend(p.events.drain(..=at));
            p.passed = point;
            Ok(())
        }
    }

    impl Drop for CudaVmm {
        fn drop(&mut self) {
            if self.segments.ctx.bind_to_thread().is_err() {
                return;
            }
            for (va, _) in self.handles.drain() {
                // SAFETY: `va` is a mapped page of the reserved range, unmapped once (drained).
                let _ = unsafe { sys::cuMemUnmap(va, self.page as usize) };
            }
            for (h, _) in self.mappings.drain() {
                // SAFETY: each physical page is unmapped everywhere now and released once (drained).
                let _ = unsafe { sys::cuMemRelease(h) };
            }
            if let Some(r) = self.range.take() {
                // SAFETY: the range was reserved by cuMemAddressReserve and nothing is mapped in it any more.
                let _ = unsafe { sys::cuMemAddressFree(r.base, r.size as usize) };
            }
        }
    }

    /// The driver's stream-ordered pool: `cuMemAllocAsync` / `cuMemFreeAsync` on one stream, with the device's
    /// default pool keeping up to `release_threshold` bytes cached across synchronizations. Used under
    /// [`Backend::Async`](crate::Backend::Async): the `Bfc` then makes one source call per block.
    #[derive(Debug)]
    pub struct CudaAsyncPool {
        segments_ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        name: String,
        regions: HashMap<u64, u64>,
    }

    impl CudaAsyncPool {
        /// The pool of device `ordinal` on its default stream.
        ///
        /// # Errors
        /// [`Error::NoCudaDevice`], or [`Error::Source`] when the device has no memory pools.
        pub fn new(ordinal: usize, release_threshold: Option<u64>) -> Result<Self> {
            let ctx = cuda_context(ordinal)?;
            let stream = ctx.default_stream();
            Self::with_stream(stream, release_threshold)
        }

        /// The pool of the stream's device, ordered on `stream`.
        ///
        /// # Errors
        /// [`Error::Source`] when the device has no memory pools or the threshold cannot be set.
        pub fn with_stream(
            stream: Arc<CudaStream>,
            release_threshold: Option<u64>,
        ) -> Result<Self> {
            let ctx = stream.context().clone();
            let name = what(ctx.ordinal());
            if !ctx.has_async_alloc() {
                return Err(Error::Source {
                    source_name: name,
                    call: "cuMemAllocAsync",
                    detail:
                        "the device has no stream-ordered memory pools; use COHORT_ALLOCATOR=bfc"
                            .into(),
                });
            }
            bind(&ctx, &name).map_err(|e| crate::bfc::source_error(e, "bind"))?;
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: the context is current; `pool` is a valid out-pointer.
            let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
            check(r, &name, "cuDeviceGetDefaultMemPool", 0)
                .map_err(|e| crate::bfc::source_error(e, "pool"))?;
            let mut threshold: u64 = release_threshold.unwrap_or(u64::MAX);
            // SAFETY: `pool` is the device's default pool; the attribute takes a pointer to a u64.
            let r = unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
            };
            check(r, &name, "cuMemPoolSetAttribute", 0)
                .map_err(|e| crate::bfc::source_error(e, "pool"))?;
            Ok(Self {
                segments_ctx: ctx,
                stream,
                name,
                regions: HashMap::new(),
            })
        }
    }

    impl MemorySource for CudaAsyncPool {
        fn name(&self) -> String {
            format!("{} (async pool)", self.name)
        }
        fn capacity(&self) -> u64 {
            capacity(&self.segments_ctx)
        }
        fn device_free(&self) -> u64 {
            device_free(&self.segments_ctx)
        }
        fn reserve(&mut self, bytes: u64) -> std::result::Result<Region, SourceError> {
            bind(&self.segments_ctx, &self.name)?;
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the context is current; the stream belongs to it; `ptr` is a valid out-pointer.
            let r =
                unsafe { sys::cuMemAllocAsync(&mut ptr, bytes as usize, self.stream.cu_stream()) };
            check(r, &self.name, "cuMemAllocAsync", bytes)?;
            self.regions.insert(ptr, bytes);
            Ok(Region {
                base: ptr,
                size: bytes,
            })
        }
        fn release(&mut self, region: Region) -> std::result::Result<(), SourceError> {
            if self.regions.remove(&region.base).is_none() {
                return Err(failed(
                    &self.name,
                    "cuMemFreeAsync",
                    format!("block {:#x} was never reserved", region.base),
                ));
            }
            bind(&self.segments_ctx, &self.name)?;
            // SAFETY: the pointer came from cuMemAllocAsync on this stream and is freed once (removed above).
            let r = unsafe { sys::cuMemFreeAsync(region.base, self.stream.cu_stream()) };
            check(r, &self.name, "cuMemFreeAsync", region.size)
        }
    }

    impl Drop for CudaAsyncPool {
        fn drop(&mut self) {
            if self.segments_ctx.bind_to_thread().is_err() {
                return;
            }
            for (base, _) in self.regions.drain() {
                // SAFETY: each pointer came from cuMemAllocAsync on this stream and is freed once (drained).
                let _ = unsafe { sys::cuMemFreeAsync(base, self.stream.cu_stream()) };
            }
            let _ = self.stream.synchronize();
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod stub {
    use crate::error::{Error, Result};
    use crate::source::{MemorySource, Region, SourceError};

    fn not_compiled(what: &str) -> Error {
        Error::NotCompiledWithCuda { what: what.into() }
    }

    /// Always false: this build has no CUDA support.
    pub fn cuda_available() -> bool {
        false
    }

    macro_rules! cuda_type {
        ($name:ident, $doc:literal) => {
            #[doc = $doc]
            #[doc = ""]
            #[doc = "This build has no `cuda` feature: constructing one is an error."]
            #[derive(Debug)]
            pub struct $name {
                _private: (),
            }

            impl MemorySource for $name {
                fn name(&self) -> String {
                    stringify!($name).into()
                }
                fn capacity(&self) -> u64 {
                    0
                }
                fn device_free(&self) -> u64 {
                    0
                }
                fn reserve(&mut self, _bytes: u64) -> std::result::Result<Region, SourceError> {
                    Err(SourceError::Failed(not_compiled(stringify!($name))))
                }
                fn release(&mut self, _region: Region) -> std::result::Result<(), SourceError> {
                    Err(SourceError::Failed(not_compiled(stringify!($name))))
                }
            }
        };
    }

    cuda_type!(CudaMemory, "Segments from cuMemAlloc.");
    cuda_type!(
        CudaVmm,
        "The stitched source over CUDA's virtual memory API."
    );
    cuda_type!(CudaAsyncPool, "The driver's stream-ordered pool.");

    impl CudaMemory {
        /// # Errors
        /// Always [`Error::NotCompiledWithCuda`].
        pub fn new(ordinal: usize) -> Result<Self> {
            Err(not_compiled(&format!("cuda:{ordinal}")))
        }
    }

    impl CudaVmm {
        /// # Errors
        /// Always [`Error::NotCompiledWithCuda`].
        pub fn new(ordinal: usize) -> Result<Self> {
            Err(not_compiled(&format!("cuda:{ordinal}")))
        }
    }

    impl CudaAsyncPool {
        /// # Errors
        /// Always [`Error::NotCompiledWithCuda`].
        pub fn new(ordinal: usize, _release_threshold: Option<u64>) -> Result<Self> {
            Err(not_compiled(&format!("cuda:{ordinal}")))
        }
    }
}
