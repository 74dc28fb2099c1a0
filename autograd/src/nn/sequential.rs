use super::{Features, Module};
use crate::{Error, Param, Result, Tape};

/// Layers run in order; parameters are named `layers.<i>.<name>`.
#[derive(Debug, Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer, naming its parameters `layers.<i>.<name>`.
    pub fn push(&mut self, layer: impl Module + 'static) {
        let i = self.layers.len();
        for (name, p) in layer.params() {
            p.set_name(format!("layers.{i}.{name}"));
        }
        self.layers.push(Box::new(layer));
    }

    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }
}

impl Module for Sequential {
    fn forward(&self, tape: &Tape, mut x: Features) -> Result<Features> {
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(tape, x).map_err(|e| match e {
                Error::Shape { op, reason } => Error::Shape {
                    op,
                    reason: format!("layers.{i}: {reason}"),
                },
                other => other,
            })?;
        }
        Ok(x)
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

    fn kind(&self) -> &'static str {
        "sequential"
    }
}
