use super::{Features, Module};
use crate::{Error, Param, Result, Tape};

/// Layers run in order; parameters and buffers are named `layers.<i>.<name>`.
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer, naming its parameters and buffers `layers.<i>.<name>`.
    pub fn push(&mut self, layer: impl Module + 'static) {
        self.push_boxed(Box::new(layer));
    }

    /// [`Sequential::push`] for a layer already boxed (a residual's projection, a layer picked at run time).
    pub fn push_boxed(&mut self, layer: Box<dyn Module>) {
        let i = self.layers.len();
        for (name, p) in layer.params().into_iter().chain(layer.buffers()) {
            p.set_name(format!("layers.{i}.{name}"));
        }
        self.layers.push(layer);
    }

    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }
}

impl Module for Sequential {
    fn forward(&self, tape: &Tape, mut x: Features) -> Result<Features> {
        let mut i = 0;
        while i < self.layers.len() {
            let layer = &self.layers[i];
            if !layer.takes_16bit() {
                x = x.in_f32()?;
            }
            let relu_next = self.layers.get(i + 1).is_some_and(|l| l.kind() == "relu");
            // A ReLU after a layer that can fuse it runs inside that layer (the names stay per layer).
            let fused = if relu_next {
                layer.forward_relu(tape, x.clone())
            } else {
                None
            };
            let step = if fused.is_some() { 2 } else { 1 };
            x = fused
                .unwrap_or_else(|| layer.forward(tape, x))
                .map_err(|e| match e {
                    Error::Shape { op, reason } => Error::Shape {
                        op,
                        reason: format!("layers.{i}: {reason}"),
                    },
                    other => other,
                })?;
            i += step;
        }
        Ok(x)
    }

    fn takes_16bit(&self) -> bool {
        true // each layer is given what it takes
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, p) in layer.params() {
                v.push((format!("layers.{i}.{name}"), p));
            }
        }
        v
    }

    fn buffers(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, p) in layer.buffers() {
                v.push((format!("layers.{i}.{name}"), p));
            }
        }
        v
    }

    fn set_masks_drawn(&self, n: u64) {
        self.layers.iter().for_each(|l| l.set_masks_drawn(n));
    }

    fn set_dropout_rates(&self, rates: &mut dyn Iterator<Item = Vec<f64>>) {
        self.layers.iter().for_each(|l| l.set_dropout_rates(rates));
    }

    fn kind(&self) -> &'static str {
        "sequential"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use cohort_tensor::{DType, Device, Tensor};

    use super::*;

    /// A layer that passes its input on and notes the dtype it was given in a log shared by the layers.
    #[derive(Debug)]
    struct Notes {
        takes_16bit: bool,
        log: Arc<Mutex<Vec<DType>>>,
    }

    impl Module for Notes {
        fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
            self.log.lock().unwrap().push(x.var.value().dtype());
            Ok(x)
        }

        fn takes_16bit(&self) -> bool {
            self.takes_16bit
        }

        fn params(&self) -> Vec<(String, Param)> {
            Vec::new()
        }

        fn kind(&self) -> &'static str {
            "notes"
        }
    }

    #[test]
    fn a_layer_that_does_not_take_16_bit_features_is_given_them_in_f32_and_their_gradient_returns_16_bit()
     {
        let tape = Tape::new();
        let x = Tensor::from_vec(vec![1.5f32, -2.0, 0.25], &[1, 3], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let xv = tape.watch(x);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut net = Sequential::new();
        for takes_16bit in [true, false, true] {
            let log = Arc::clone(&log);
            net.push(Notes { takes_16bit, log });
        }
        let y = net.forward(&tape, Features::shared(xv.clone())).unwrap();
        // The first layer takes bf16 as it comes; the second is given f32, and so the third sees f32 too.
        assert_eq!(*log.lock().unwrap(), [DType::BF16, DType::F32, DType::F32]);
        assert_eq!(y.var.value().dtype(), DType::F32);
        let grads = tape.backward(&y.var.sum_all().unwrap()).unwrap();
        let g = grads.get(&xv).expect("the input's gradient");
        assert_eq!(
            g.dtype(),
            DType::BF16,
            "a gradient comes back in its value's dtype"
        );
        assert_eq!(
            g.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
            [1.0; 3]
        );
    }
}
