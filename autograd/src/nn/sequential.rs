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
            let pool_after = self.layers.get(i + 2).and_then(|l| l.as_max_pool());
            // A ReLU (and a max pool after it) after a layer that can fuse them runs inside that layer (the names
            // stay per layer).
            let mut fused = match pool_after {
                Some(pool) if relu_next => layer
                    .forward_relu_max_pool(tape, x.clone(), pool)
                    .map(|y| (y, 3)),
                _ => None,
            };
            if fused.is_none() && relu_next {
                fused = layer.forward_relu(tape, x.clone()).map(|y| (y, 2));
            }
            let (y, step) = fused.unwrap_or_else(|| (layer.forward(tape, x), 1));
            x = y.map_err(|e| match e {
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

    use crate::Var;

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

    /// A layer that passes its input on and notes which of its forms a [`Sequential`] ran.
    #[derive(Debug)]
    struct Probe(Arc<Mutex<Vec<&'static str>>>);

    impl Probe {
        fn ran(&self, form: &'static str, x: Features) -> Option<Result<Features>> {
            self.0.lock().unwrap().push(form);
            Some(Ok(x))
        }
    }

    impl Module for Probe {
        fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
            self.ran("alone", x).unwrap()
        }

        fn forward_relu(&self, _tape: &Tape, x: Features) -> Option<Result<Features>> {
            self.ran("with its relu", x)
        }

        fn forward_relu_max_pool(
            &self,
            _tape: &Tape,
            x: Features,
            _pool: &crate::nn::MaxPool2d,
        ) -> Option<Result<Features>> {
            self.ran("with its relu and pool", x)
        }

        fn params(&self) -> Vec<(String, Param)> {
            Vec::new()
        }

        fn kind(&self) -> &'static str {
            "probe"
        }
    }

    #[test]
    fn a_layer_is_given_the_relu_and_max_pool_after_it_where_it_takes_them() {
        use crate::nn::{Activation, ActivationKind, MaxPool2d};

        let log = Arc::new(Mutex::new(Vec::new()));
        let mut net = Sequential::new();
        net.push(Probe(Arc::clone(&log)));
        net.push(Activation(ActivationKind::Relu));
        net.push(MaxPool2d::new(2, 2));
        net.push(Probe(Arc::clone(&log)));
        net.push(Activation(ActivationKind::Relu));
        net.push(Probe(Arc::clone(&log)));
        net.push(MaxPool2d::new(2, 2));
        let tape = Tape::new();
        let x = Tensor::zeros(&[1, 1, 8, 8], DType::F32, &Device::Cpu).unwrap();
        let y = net.forward(&tape, Features::shared(tape.watch(x))).unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["with its relu and pool", "with its relu", "alone"]
        );
        assert_eq!(y.var.shape(), [1, 1, 4, 4], "the last pool ran on its own");
    }

    /// The loss `sum(y · r)` of `y` against fixed random weights (so that each gradient differs per element).
    fn weighted(y: &Var, seed: u64) -> Var {
        let r = Tensor::rand_normal(y.shape(), 0.0, 1.0, DType::F32, seed, &Device::Cpu).unwrap();
        y.mul(&Var::constant(r)).unwrap().sum_all().unwrap()
    }

    #[test]
    fn a_convolution_then_a_relu_and_a_max_pool_moves_its_bias_and_relu_after_the_pool_with_the_same_values_and_gradients()
     {
        use crate::nn::{Activation, ActivationKind, Conv2d, MaxPool2d};

        let dev = Device::Cpu;
        // Windows that tile the planes and windows that overlap; two members, so the second convolution is
        // grouped over packed features.
        for (k, s) in [(2, 2), (3, 2)] {
            let mut net = Sequential::new();
            for (inp, pool) in [(3, (k, s)), (4, (2, 2))] {
                let seeds = [11, 12];
                net.push(Conv2d::new(inp, 4, 3, 1, 1, 2.0, &seeds, DType::F32, &dev).unwrap());
                net.push(Activation(ActivationKind::Relu));
                net.push(MaxPool2d::new(pool.0, pool.1));
            }
            let params = net.params();
            for (i, (name, p)) in params.iter().enumerate() {
                if name.ends_with("bias") {
                    let b =
                        Tensor::rand_normal(p.shape(), 0.0, 0.5, DType::F32, 40 + i as u64, &dev);
                    p.set(&b.unwrap()).unwrap();
                }
            }
            let x = Tensor::rand_normal(&[2, 3, 11, 11], 0.0, 1.0, DType::F32, 9, &dev).unwrap();

            let run = |fused: bool| {
                let tape = Tape::new();
                let xv = tape.watch(x.clone());
                let mut f = Features::shared(xv.clone());
                if fused {
                    f = net.forward(&tape, f).unwrap();
                } else {
                    for layer in net.layers() {
                        f = layer.forward(&tape, f).unwrap();
                    }
                }
                let grads = tape.backward(&weighted(&f.var, 5)).unwrap();
                let mut out = vec![f.var.value().clone(), grads.get(&xv).unwrap().clone()];
                out.extend(params.iter().map(|(_, p)| grads.param(p).unwrap().clone()));
                out
            };
            let (fused, plain) = (run(true), run(false));
            let names = ["output", "input gradient"]
                .into_iter()
                .map(String::from)
                .chain(params.iter().map(|(n, _)| format!("{n} gradient")));
            for ((a, b), name) in fused.iter().zip(&plain).zip(names) {
                assert_eq!(a.shape(), b.shape(), "{name}");
                let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
                let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                let off = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    off <= 1e-5 * scale,
                    "{k}/{s} {name}: off by {off:e} of {scale:e}"
                );
            }
        }
    }
}
