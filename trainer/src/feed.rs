//! The per-member feeds that batch a [`DataSet`]'s training pipeline.
//!
//! Each member (or fused group) reads its data set's pipeline (shared by every member naming it: the examples
//! are opened once) through its own [`Feed`], which stacks examples into batches of whatever size the member has now: a batch that
//! shrinks after an OOM, or changes through the control file, continues from the very next example. The feed's
//! [`Position`] (epoch, examples taken) goes into checkpoints, so a resumed member sees exactly the batches it would
//! have seen.
//!
//! On a GPU the feed prefetches to the device: taking a batch starts the next one's copy on the copy stream
//! (through pinned staging buffers), so that it overlaps the step that uses this one. The prefetched batch is not
//! consumed until it is taken: the feed's position, saved in checkpoints and restored after an OOM, stays the one
//! of the next batch to be used.

use std::sync::Arc;

use cohort_data::{Array, Iter, Position, Staged, ToDevice, TrainBatch};
use cohort_tensor::cuda::Uploader;
use cohort_tensor::{Device, Tensor};

use crate::dataset::DataSet;
use crate::error::Result;

/// One member's (or fused group's) reader of a [`DataSet`].
#[derive(Debug)]
pub struct Feed {
    data: Arc<DataSet>,
    iter: Iter<(Array, Array)>,
    prefetch: usize,
    /// Device prefetch: the uploader, and the next batch on its way to the device.
    uploader: Option<Uploader>,
    staged: Option<Ahead>,
}

/// A batch whose copy to the device was started before it is taken (dropped untaken, it still
/// orders the compute stream after its copy: see [`Staged`]).
#[derive(Debug)]
struct Ahead {
    batch: Staged<TrainBatch>,
    /// The batch size it was read for.
    size: usize,
    /// The position before it.
    from: Position,
}

/// A batch on the host.
#[derive(Debug)]
pub struct Batch {
    /// Features `[n, prod(shape)]`.
    pub x: Vec<f32>,
    /// Targets `[n, ..]`: class ids, real values or next tokens, as the data set's task says.
    pub y: Array,
    /// Examples in it.
    pub n: usize,
}

impl Feed {
    /// A feed at `pos` (the start: `Position::default()`); `prefetch` examples are prepared ahead.
    ///
    /// # Errors
    /// When `pos` belongs to another pipeline.
    pub fn open(data: Arc<DataSet>, pos: &Position, prefetch: usize) -> Result<Feed> {
        let ds = if prefetch > 0 {
            data.train.prefetch(prefetch)
        } else {
            data.train.clone()
        };
        let iter = if *pos == Position::default() {
            ds.iter()
        } else {
            ds.iter_from(&Position::new(pos.epoch, pos.index))?
        };
        Ok(Feed {
            data,
            iter,
            prefetch,
            uploader: None,
            staged: None,
        })
    }

    /// With prefetch to `device` when it is a GPU (see the module docs); unchanged on the CPU.
    ///
    /// # Errors
    /// No such GPU.
    pub fn with_device_prefetch(mut self, device: &Device) -> Result<Feed> {
        if device.is_cuda() {
            // Two copies in flight at most (the one being taken, the next), and one slot to fill.
            self.uploader = Some(Uploader::new(device, 3)?);
        }
        Ok(self)
    }

    /// The data set.
    pub fn data(&self) -> &Arc<DataSet> {
        &self.data
    }

    /// Where the next example to be used comes from (a prefetched batch is not used yet).
    pub fn position(&self) -> Position {
        match &self.staged {
            Some(s) => s.from,
            None => self.read_position(),
        }
    }

    fn read_position(&self) -> Position {
        let p = self.iter.pos();
        Position::new(p.epoch, p.index)
    }

    /// Goes back (or forward) to `pos`: after an OOM, the failed batch is taken again, smaller.
    ///
    /// # Errors
    /// As [`Feed::open`].
    pub fn seek(&mut self, pos: &Position) -> Result<()> {
        let uploader = self.uploader.take();
        *self = Feed::open(self.data.clone(), pos, self.prefetch)?;
        self.uploader = uploader;
        Ok(())
    }

    /// The next batch of up to `b` examples as tensors on `device`: features `[n, prod(shape)]` and labels `[n]`.
    /// With device prefetch it is the batch staged by the previous call (read again if the size asked for
    /// changed), and the following batch starts its copy now; the compute stream waits for this one's copy.
    /// Call it in the tenant scope that should hold the batches.
    ///
    /// # Errors
    /// A pipeline error, or the device's (out of memory, a failed copy).
    pub fn next_tensors(&mut self, b: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let Some(mut uploader) = self.uploader.take() else {
            let batch = self.batch_on(b, device)?;
            return Ok((batch.inputs, batch.labels));
        };
        let r = self.take_ahead(b, &mut uploader);
        self.uploader = Some(uploader);
        let batch = r?;
        Ok((batch.inputs, batch.labels))
    }

    /// The batch staged ahead (read again if its size is not `b`), with the next one staged.
    fn take_ahead(&mut self, b: usize, uploader: &mut Uploader) -> Result<TrainBatch> {
        let now = match self.staged.take() {
            Some(s) if s.size == b => s,
            other => {
                if let Some(s) = other {
                    self.seek(&s.from)?;
                }
                self.stage(b, uploader)?
            }
        };
        self.staged = Some(self.stage(b, uploader)?);
        Ok(now.batch.finish()?)
    }

    /// Reads the next batch and starts its copy to the device.
    fn stage(&mut self, b: usize, uploader: &mut Uploader) -> Result<Ahead> {
        let from = self.read_position();
        let (batch, ready) = self.batch_on(b, &Device::Cpu)?.upload(uploader)?;
        Ok(Ahead {
            batch: Staged::in_flight(batch, ready),
            size: b,
            from,
        })
    }

    /// The next batch of up to `b` examples as tensors on `device`.
    fn batch_on(&mut self, b: usize, device: &Device) -> Result<TrainBatch> {
        let batch = self.next_batch(b)?;
        let per: usize = self.data.shape.iter().product();
        Ok(TrainBatch {
            inputs: Tensor::from_vec(batch.x, &[batch.n, per], device)?,
            labels: batch.y.to_tensor(device)?,
        })
    }

    /// The next batch of up to `b` examples; it ends early at the end of an epoch (the last batch is partial).
    ///
    /// # Errors
    /// A pipeline error.
    pub fn next_batch(&mut self, b: usize) -> Result<Batch> {
        let per: usize = self.data.shape.iter().product();
        let mut x = Vec::with_capacity(b * per);
        let mut y: Vec<Array> = Vec::with_capacity(b);
        // An epoch that ended exactly on the previous batch: step into the next one.
        if self.iter.pos().index >= self.data.train_len {
            let _ = self.iter.next().transpose()?;
            debug_assert_eq!(self.iter.pos().index, 0);
        }
        while y.len() < b {
            match self.iter.next() {
                Some(item) => {
                    let (xa, ya) = item?;
                    x.extend_from_slice(xa.as_f32().unwrap_or(&[]));
                    y.push(ya);
                }
                None => {
                    if y.is_empty() {
                        continue;
                    }
                    break;
                }
            }
            if self.iter.pos().index >= self.data.train_len {
                break;
            }
        }
        let n = y.len();
        Ok(Batch {
            x,
            y: Array::stack(y)?,
            n,
        })
    }
}
