//! The layer vocabulary: a model written as data (TOML), read once into typed layer specs and built into a
//! [`Model`] of `M` members.
//!
//! Each kind's spec, its defaults, its output shape and its parameter count live beside its layer in
//! `nn/<layer>.rs` ([`LinearSpec`](crate::nn::LinearSpec) next to [`Linear`](crate::nn::Linear)); this module reads
//! a layer table into the right one and walks the shapes. Their JSON form (serde) is what a checkpoint's manifest
//! records of a member's model.

mod model;
mod read;

use std::fmt;

use cohort_tensor::{DType, Device};
use serde::Serialize;
use toml::{Table, Value};

pub use model::Model;
pub use read::{Fields, SpecError, SpecResult, describe};

use crate::nn::{
    Activation, ActivationKind, AttentionSpec, AvgPool2d, BatchNormSpec, ConvSpec, Dropout,
    DropoutSpec, EmbeddingBag, EmbeddingSpec, Flatten, GlobalAvgPool, LayerNorm, LayerNormSpec,
    LinearSpec, MaxPool2d, MultiHeadAttention, PoolSpec, PositionalEmbedding, PositionalSpec,
    ResidualSpec, Sequence, SequencePool, SequencePoolSpec, SequenceSpec, Sequential,
    TransformerSpec, global_avgpool_output, mix,
};
use crate::{Error, Result};

/// A stack of layers, in TOML
/// `layers = [{ conv = 16, kernel = 3, act = "relu" }, { maxpool = 2 }, { flatten = true }, { linear = 10 }]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelSpec {
    /// The layers, in order.
    pub layers: Vec<LayerSpec>,
}

/// One layer: its kind and that kind's options. In TOML a table with exactly one kind key, whose value is the
/// kind's main size (`{ linear = 128 }`, `{ conv = 16, kernel = 5 }`, `{ dropout = 0.1 }`, `{ flatten = true }`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerSpec {
    /// `linear = OUT`: a dense layer.
    Linear(LinearSpec),
    /// `conv = OUT`: a 2-D convolution.
    Conv(ConvSpec),
    /// `maxpool = K`: max pooling.
    MaxPool(PoolSpec),
    /// `flatten = true`: each example's features as one vector.
    Flatten,
    /// `dropout = P`.
    Dropout(DropoutSpec),
    /// `act = "relu"` alone: an activation layer.
    Act(ActivationKind),
    /// `embedding = D, vocab = V`.
    Embedding(EmbeddingSpec),
    /// `embedding_bag = D, vocab = V`.
    EmbeddingBag(EmbeddingSpec),
    /// `layernorm = true`.
    LayerNorm(LayerNormSpec),
    /// `avgpool = K`: average pooling.
    AvgPool(PoolSpec),
    /// `global_avgpool = true`: each channel's mean over the image.
    GlobalAvgPool,
    /// `batchnorm = true`.
    BatchNorm(BatchNormSpec),
    /// `residual = [LAYERS]`: the layers' output plus their input.
    Residual(ResidualSpec),
    /// `attention = HEADS`: multi-head self-attention.
    Attention(AttentionSpec),
    /// `transformer = HEADS`: a pre-norm Transformer encoder block.
    Transformer(TransformerSpec),
    /// `positional = MAX_LEN`: learned positions.
    Positional(PositionalSpec),
    /// `pool = "mean" | "first"`: a sequence as one vector.
    SequencePool(SequencePoolSpec),
    /// `sequence = L`: each example as `L` tokens.
    Sequence(SequenceSpec),
}

/// The kind keys a layer table may have, for messages.
pub const LAYER_KINDS: &[&str] = &[
    "linear",
    "conv",
    "maxpool",
    "flatten",
    "dropout",
    "act",
    "embedding",
    "embedding_bag",
    "layernorm",
    "avgpool",
    "global_avgpool",
    "batchnorm",
    "residual",
    "attention",
    "transformer",
    "positional",
    "pool",
    "sequence",
];

/// The shape of one example between layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// i32 token ids (`[L]`, ...).
    Tokens(Vec<usize>),
    /// Float features; the last dimension is the width (`[D]`, or `[L, D]` for a sequence).
    Dense(Vec<usize>),
    /// An image.
    Image {
        /// Channels.
        channels: usize,
        /// Rows.
        height: usize,
        /// Columns.
        width: usize,
    },
}

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Shape::Tokens(d) | Shape::Dense(d) => d.clone(),
            Shape::Image {
                channels,
                height,
                width,
            } => vec![*channels, *height, *width],
        }
    }

    /// Values per example.
    pub fn elems(&self) -> usize {
        self.dims().iter().product()
    }

    /// The last dimension.
    pub fn width(&self) -> usize {
        self.dims().last().copied().unwrap_or(0)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Shape::Tokens(_) => "token ids",
            Shape::Dense(d) if d.len() == 1 => "features",
            Shape::Dense(_) => "a sequence of features",
            Shape::Image { .. } => "an image",
        };
        write!(f, "{what} {:?}", self.dims())
    }
}

/// What to build: dtype and device of the parameters, one seed per member.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Parameter dtype (F32; F64 on the CPU for gradient checks).
    pub dtype: DType,
    /// Where the parameters live.
    pub device: Device,
    /// One initialization seed per member; `M = seeds.len()`.
    pub seeds: Vec<u64>,
}

impl BuildOptions {
    /// `members` members seeded `seed, seed+1, ..` in f32 on `device`.
    pub fn new(members: usize, seed: u64, device: Device) -> BuildOptions {
        BuildOptions {
            dtype: DType::F32,
            device,
            seeds: (0..members as u64).map(|i| seed + i).collect(),
        }
    }
}

/// What a layer is built with: one seed per member (already particular to the layer), dtype and device.
#[derive(Debug)]
pub(crate) struct LayerCtx<'a> {
    pub seeds: Vec<u64>,
    pub dtype: DType,
    pub device: &'a Device,
}

impl LayerCtx<'_> {
    pub(crate) fn members(&self) -> usize {
        self.seeds.len()
    }

    /// The context of the `i`-th layer inside this one (distinct seeds per layer, the same for member `m`
    /// whatever `M` is).
    pub(crate) fn child(&self, i: usize) -> LayerCtx<'_> {
        LayerCtx {
            seeds: self.seeds.iter().map(|&s| mix(s, i as u64 + 1)).collect(),
            dtype: self.dtype,
            device: self.device,
        }
    }
}

pub(crate) fn is_true(b: &bool) -> bool {
    *b
}

impl LayerSpec {
    /// Reads one layer table.
    ///
    /// # Errors
    /// [`SpecError`] naming the key: no kind or several, an unknown kind or option, a value out of range.
    pub fn read(f: &Fields<'_>) -> SpecResult<LayerSpec> {
        let t = f.table();
        // `act` and `dropout` are also options of other kinds (`{ linear = 8, act = "relu" }`,
        // `{ transformer = 4, dropout = 0.1 }`): kinds of their own only when alone.
        let alone = ["act", "dropout"];
        let kinds: Vec<&str> = LAYER_KINDS
            .iter()
            .copied()
            .filter(|k| !alone.contains(k) && t.contains_key(*k))
            .collect();
        let kind = match kinds[..] {
            [k] => k,
            [] if t.contains_key("dropout") => "dropout",
            [] if t.contains_key("act") => "act",
            [] => {
                let known = LAYER_KINDS.join(", ");
                return Err(match t.keys().next() {
                    Some(k) => f.error(k, format!("unknown layer kind; known kinds: {known}")),
                    None => f.error("", format!("an empty layer; give one of {known}")),
                });
            }
            _ => {
                return Err(f.error(
                    "",
                    format!(
                        "several kinds in one layer ({}); split them into separate layers",
                        kinds.join(", ")
                    ),
                ));
            }
        };
        let spec = match kind {
            "linear" => LayerSpec::Linear(LinearSpec::read(f)?),
            "conv" => LayerSpec::Conv(ConvSpec::read(f)?),
            "maxpool" => LayerSpec::MaxPool(PoolSpec::read(f, kind)?),
            "flatten" => {
                f.flag(kind)?;
                LayerSpec::Flatten
            }
            "dropout" => LayerSpec::Dropout(DropoutSpec::read(f)?),
            "act" => LayerSpec::Act(ActivationKind::read(f)?.expect("the key is there")),
            "embedding" => LayerSpec::Embedding(EmbeddingSpec::read(f, kind)?),
            "embedding_bag" => {
                let e = EmbeddingSpec::read(f, kind)?;
                if e.padding_id.is_some() {
                    return Err(f.error(
                        "padding_id",
                        "a bag's mean counts every id; for a mean that skips padding use \
                         { embedding = D, vocab = V, padding_id = P } and then { pool = \"mean\" }",
                    ));
                }
                LayerSpec::EmbeddingBag(e)
            }
            "layernorm" => LayerSpec::LayerNorm(LayerNormSpec::read(f)?),
            "avgpool" => LayerSpec::AvgPool(PoolSpec::read(f, kind)?),
            "global_avgpool" => {
                f.flag(kind)?;
                LayerSpec::GlobalAvgPool
            }
            "batchnorm" => LayerSpec::BatchNorm(BatchNormSpec::read(f)?),
            "residual" => LayerSpec::Residual(ResidualSpec::read(f)?),
            "attention" => LayerSpec::Attention(AttentionSpec::read(f)?),
            "transformer" => LayerSpec::Transformer(TransformerSpec::read(f)?),
            "positional" => LayerSpec::Positional(PositionalSpec::read(f)?),
            "pool" => LayerSpec::SequencePool(SequencePoolSpec::read(f)?),
            "sequence" => LayerSpec::Sequence(SequenceSpec::read(f)?),
            other => unreachable!("{other} is in LAYER_KINDS"),
        };
        f.finish()?;
        Ok(spec)
    }

    /// The kind as written in TOML.
    pub fn kind(&self) -> &'static str {
        match self {
            LayerSpec::Linear(_) => "linear",
            LayerSpec::Conv(_) => "conv",
            LayerSpec::MaxPool(_) => "maxpool",
            LayerSpec::Flatten => "flatten",
            LayerSpec::Dropout(_) => "dropout",
            LayerSpec::Act(_) => "act",
            LayerSpec::Embedding(_) => "embedding",
            LayerSpec::EmbeddingBag(_) => "embedding_bag",
            LayerSpec::LayerNorm(_) => "layernorm",
            LayerSpec::AvgPool(_) => "avgpool",
            LayerSpec::GlobalAvgPool => "global_avgpool",
            LayerSpec::BatchNorm(_) => "batchnorm",
            LayerSpec::Residual(_) => "residual",
            LayerSpec::Attention(_) => "attention",
            LayerSpec::Transformer(_) => "transformer",
            LayerSpec::Positional(_) => "positional",
            LayerSpec::SequencePool(_) => "pool",
            LayerSpec::Sequence(_) => "sequence",
        }
    }

    /// The activation applied after the layer (`act = ...` beside the kind).
    fn act(&self) -> Option<ActivationKind> {
        match self {
            LayerSpec::Linear(l) => l.act,
            LayerSpec::Conv(c) => c.act,
            LayerSpec::BatchNorm(b) => b.act,
            LayerSpec::Residual(r) => r.act,
            _ => None,
        }
    }

    /// The shape of one example after the layer.
    ///
    /// # Errors
    /// A sentence saying why the layer does not fit `input` and what to do.
    pub fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        match self {
            LayerSpec::Linear(l) => l.output(input),
            LayerSpec::Conv(c) => c.output(input),
            LayerSpec::MaxPool(p) => p.output(input),
            LayerSpec::Flatten => match input {
                Shape::Tokens(_) => {
                    Err("token ids cannot be flattened; add an embedding first".into())
                }
                _ => Ok(Shape::Dense(vec![input.elems()])),
            },
            LayerSpec::Dropout(_) | LayerSpec::Act(_) => Ok(input.clone()),
            LayerSpec::Embedding(e) => e.output(input, false),
            LayerSpec::EmbeddingBag(e) => e.output(input, true),
            LayerSpec::LayerNorm(n) => n.output(input),
            LayerSpec::AvgPool(p) => p.output(input),
            LayerSpec::GlobalAvgPool => global_avgpool_output(input),
            LayerSpec::BatchNorm(_) => BatchNormSpec::channels(input).map(|_| input.clone()),
            LayerSpec::Residual(r) => r.output(input),
            LayerSpec::Attention(a) => AttentionSpec::output(a.heads, input),
            LayerSpec::Transformer(t) => AttentionSpec::output(t.heads, input),
            LayerSpec::Positional(p) => p.output(input),
            LayerSpec::SequencePool(p) => p.output(input),
            LayerSpec::Sequence(q) => q.output(input),
        }
    }

    /// Trainable values of one member, for an input of shape `input` (which fits).
    pub fn param_count(&self, input: &Shape) -> usize {
        match self {
            LayerSpec::Linear(l) => l.params(input),
            LayerSpec::Conv(c) => c.params(input),
            LayerSpec::Embedding(e) | LayerSpec::EmbeddingBag(e) => e.params(),
            LayerSpec::LayerNorm(_) => 2 * input.width(),
            LayerSpec::BatchNorm(_) => 2 * BatchNormSpec::channels(input).unwrap_or(0),
            LayerSpec::Residual(r) => r.params(input),
            LayerSpec::Attention(_) => AttentionSpec::params(input.width()),
            LayerSpec::Transformer(t) => t.params(input.width()),
            LayerSpec::Positional(p) => p.max_len * input.width(),
            LayerSpec::MaxPool(_)
            | LayerSpec::AvgPool(_)
            | LayerSpec::GlobalAvgPool
            | LayerSpec::Flatten
            | LayerSpec::Dropout(_)
            | LayerSpec::Act(_)
            | LayerSpec::SequencePool(_)
            | LayerSpec::Sequence(_) => 0,
        }
    }

    /// Values one example keeps for the backward pass beyond the layer's output (scratch such as im2col).
    fn scratch(&self, input: &Shape, output: &Shape) -> usize {
        match self {
            LayerSpec::Conv(c) => c.scratch(input, output),
            LayerSpec::MaxPool(p) => p.scratch(output),
            LayerSpec::BatchNorm(_) | LayerSpec::LayerNorm(_) => input.elems(),
            LayerSpec::Residual(r) => r.scratch(input),
            LayerSpec::Attention(a) => AttentionSpec::scratch(a.heads, input) + 3 * input.elems(),
            LayerSpec::Transformer(t) => t.scratch(input),
            _ => 0,
        }
    }

    /// Whether the layer draws random masks while training (such a step cannot be replayed as a CUDA graph).
    fn draws_masks(&self) -> bool {
        match self {
            LayerSpec::Dropout(d) => d.p > 0.0,
            LayerSpec::Transformer(t) => t.dropout > 0.0,
            LayerSpec::Residual(r) => r.layers.iter().any(LayerSpec::draws_masks),
            _ => false,
        }
    }

    /// Builds the layer (and its activation) onto `net`.
    fn build(&self, input: &Shape, ctx: &LayerCtx<'_>, net: &mut Sequential) -> Result<()> {
        match self {
            LayerSpec::Linear(l) => net.push(l.build(input, ctx)?),
            LayerSpec::Conv(c) => net.push(c.build(input, ctx)?),
            LayerSpec::MaxPool(p) => net.push(MaxPool2d::new(p.kernel, p.stride)),
            LayerSpec::AvgPool(p) => net.push(AvgPool2d::new(p.kernel, p.stride)),
            LayerSpec::GlobalAvgPool => net.push(GlobalAvgPool::new(ctx.members())),
            LayerSpec::Flatten => net.push(Flatten::new(ctx.members())),
            LayerSpec::Dropout(d) => net.push(Dropout::new(d.p, ctx.seeds[0])?),
            LayerSpec::Act(a) => net.push(Activation(*a)),
            LayerSpec::Embedding(e) => net.push(e.build(ctx)?),
            LayerSpec::EmbeddingBag(e) => {
                net.push(EmbeddingBag::new(
                    e.vocab, e.dim, &ctx.seeds, ctx.dtype, ctx.device,
                )?);
            }
            LayerSpec::LayerNorm(n) => net.push(LayerNorm::new(
                input.width(),
                n.eps,
                ctx.members(),
                ctx.dtype,
                ctx.device,
            )?),
            LayerSpec::BatchNorm(b) => net.push(b.build(input, ctx)?),
            LayerSpec::Residual(r) => net.push(r.build(input, ctx)?),
            LayerSpec::Attention(a) => net.push(MultiHeadAttention::new(
                input.width(),
                a.heads,
                a.causal,
                &ctx.seeds,
                ctx.dtype,
                ctx.device,
            )?),
            LayerSpec::Transformer(t) => net.push(t.build(input, ctx)?),
            LayerSpec::Positional(p) => net.push(PositionalEmbedding::new(
                p.max_len,
                input.width(),
                &ctx.seeds,
                ctx.dtype,
                ctx.device,
            )?),
            LayerSpec::SequencePool(p) => net.push(SequencePool::new(p.mode)),
            LayerSpec::Sequence(q) => {
                let d = input.elems() / q.tokens;
                net.push(Sequence::new(q.tokens, d, ctx.members()));
            }
        }
        if let Some(a) = self.act() {
            net.push(Activation(a));
        }
        Ok(())
    }
}

/// Walks `layers` from `input`: each layer's output shape, or the index and reason of the first that does not fit.
pub(crate) fn walk(layers: &[LayerSpec], input: &Shape) -> Result<Vec<Shape>> {
    let mut shapes = vec![input.clone()];
    for (i, l) in layers.iter().enumerate() {
        let next = l.output(&shapes[i]).map_err(|reason| Error::Spec {
            index: i,
            kind: l.kind().into(),
            reason,
        })?;
        shapes.push(next);
    }
    Ok(shapes)
}

impl ModelSpec {
    /// Parses a TOML document holding `layers = [...]`.
    ///
    /// # Errors
    /// [`SpecError`] naming the key, for invalid TOML, unknown kinds or options and values out of range.
    pub fn from_toml(text: &str) -> SpecResult<ModelSpec> {
        let table: Table = text.parse().map_err(|e: toml::de::Error| SpecError {
            key: String::new(),
            message: format!("not valid TOML: {}", e.to_string().trim()),
        })?;
        let f = Fields::new(&table, "", false);
        let spec = ModelSpec::read(&f)?;
        f.finish()?;
        Ok(spec)
    }

    /// Reads the `layers` list of the table `f` (other keys of `f` are left to the caller).
    ///
    /// # Errors
    /// [`SpecError`] naming the key.
    pub fn read(f: &Fields<'_>) -> SpecResult<ModelSpec> {
        Ok(ModelSpec {
            layers: read_layers(f, "layers")?,
        })
    }

    /// The shape a model of this spec takes for examples of shape `data`: token ids and images as they are for
    /// models that start with an embedding or an image layer, flat features otherwise.
    pub fn input_for(&self, data: &[usize]) -> Vec<usize> {
        match self.first() {
            Some(l) if data.len() == 3 && takes_image(l) => data.to_vec(),
            Some(LayerSpec::Embedding(_) | LayerSpec::EmbeddingBag(_)) => data.to_vec(),
            _ => vec![data.iter().product()],
        }
    }

    /// For a model that takes token ids (it starts with an embedding): the number of ids its embedding has.
    pub fn vocab(&self) -> Option<usize> {
        match self.first() {
            Some(LayerSpec::Embedding(e) | LayerSpec::EmbeddingBag(e)) => Some(e.vocab),
            _ => None,
        }
    }

    /// The first layer that is not a dropout or an activation (which take any shape).
    fn first(&self) -> Option<&LayerSpec> {
        self.layers
            .iter()
            .find(|l| !matches!(l, LayerSpec::Dropout(_) | LayerSpec::Act(_)))
    }

    /// The per-example shape the first layer sees for a model input of shape `input`.
    fn input_shape(&self, input: &[usize]) -> Result<Shape> {
        let bad = |reason: String| Error::Spec {
            index: 0,
            kind: "input".into(),
            reason,
        };
        match (self.first(), input) {
            (_, []) => Err(bad("empty input shape".into())),
            (_, d) if d.contains(&0) => Err(bad(format!("input shape {d:?} has a zero dimension"))),
            (Some(LayerSpec::Embedding(_) | LayerSpec::EmbeddingBag(_)), d) => {
                Ok(Shape::Tokens(d.to_vec()))
            }
            (Some(l), &[channels, height, width]) if takes_image(l) => Ok(Shape::Image {
                channels,
                height,
                width,
            }),
            (_, d) => Ok(Shape::Dense(d.to_vec())),
        }
    }

    /// Each layer's per-example output shape for a model input of shape `input`.
    ///
    /// # Errors
    /// [`Error::Spec`] naming the first layer that does not fit.
    pub fn shapes(&self, input: &[usize]) -> Result<Vec<Shape>> {
        walk(&self.layers, &self.input_shape(input)?)
    }

    /// Trainable values of one member.
    ///
    /// # Errors
    /// As [`ModelSpec::shapes`].
    pub fn param_count(&self, input: &[usize]) -> Result<usize> {
        let shapes = self.shapes(input)?;
        Ok(self
            .layers
            .iter()
            .zip(&shapes)
            .map(|(l, s)| l.param_count(s))
            .sum())
    }

    /// Values one example's forward pass keeps for its backward pass (inputs, outputs, scratch), for memory
    /// accounting; twice that counts their gradients.
    ///
    /// # Errors
    /// As [`ModelSpec::shapes`].
    pub fn activation_count(&self, input: &[usize]) -> Result<usize> {
        let shapes = self.shapes(input)?;
        Ok(shapes[0].elems() + activation_count(&self.layers, &shapes))
    }

    /// Whether a training step draws random masks (dropout), so that it cannot be replayed as a CUDA graph.
    pub fn draws_masks(&self) -> bool {
        self.layers.iter().any(LayerSpec::draws_masks)
    }

    /// Builds the model for examples of shape `input` (`[784]`, `[1, 28, 28]`, `[L]` of token ids).
    ///
    /// # Errors
    /// [`Error::Spec`] naming the layer (index and kind) whose shape does not fit or that cannot be built; tensor
    /// errors from making the parameters.
    pub fn build(&self, input: &[usize], opts: &BuildOptions) -> Result<Model> {
        if opts.seeds.is_empty() {
            return Err(Error::Spec {
                index: 0,
                kind: "model".into(),
                reason: "no members: give at least one seed".into(),
            });
        }
        let shapes = self.shapes(input)?;
        let ctx = LayerCtx {
            seeds: opts.seeds.clone(),
            dtype: opts.dtype,
            device: &opts.device,
        };
        let mut net = Sequential::new();
        for (i, l) in self.layers.iter().enumerate() {
            l.build(&shapes[i], &ctx.child(i), &mut net)
                .map_err(|e| match e {
                    Error::Spec { kind, reason, .. } => Error::Spec {
                        index: i,
                        kind,
                        reason,
                    },
                    other => other,
                })?;
        }
        let output = shapes.last().expect("the input's shape").dims();
        Ok(Model::new(
            net,
            input,
            &output,
            opts.seeds.len(),
            opts.dtype,
            opts.device,
        )
        .with_spec(self.clone()))
    }
}

/// Values `layers` keep for the backward pass beyond their input, whose shapes `shapes` are (the input's first).
pub(crate) fn activation_count(layers: &[LayerSpec], shapes: &[Shape]) -> usize {
    let mut total = 0;
    for (i, l) in layers.iter().enumerate() {
        let out = shapes[i + 1].elems();
        total += out + l.scratch(&shapes[i], &shapes[i + 1]);
        if l.act().is_some() {
            total += out;
        }
    }
    total
}

/// Builds `layers`, whose input shapes `shapes` are, into one stack: layer `i` from `ctx.child(i)`'s seeds. An error
/// of a layer names its index.
pub(crate) fn build_layers(
    layers: &[LayerSpec],
    shapes: &[Shape],
    ctx: &LayerCtx<'_>,
) -> Result<Sequential> {
    let mut net = Sequential::new();
    for (i, l) in layers.iter().enumerate() {
        l.build(&shapes[i], &ctx.child(i), &mut net)
            .map_err(|e| Error::Spec {
                index: i,
                kind: l.kind().into(),
                reason: match e {
                    Error::Spec { reason, .. } | Error::Shape { reason, .. } => reason,
                    other => other.to_string(),
                },
            })?;
    }
    Ok(net)
}

/// Whether a layer first in a model takes images as they are.
fn takes_image(l: &LayerSpec) -> bool {
    match l {
        LayerSpec::Conv(_)
        | LayerSpec::MaxPool(_)
        | LayerSpec::AvgPool(_)
        | LayerSpec::GlobalAvgPool
        | LayerSpec::BatchNorm(_) => true,
        LayerSpec::Residual(r) => r.layers.first().is_some_and(takes_image),
        _ => false,
    }
}

/// Reads the list of layer tables at `key` of `f`.
pub(crate) fn read_layers(f: &Fields<'_>, key: &str) -> SpecResult<Vec<LayerSpec>> {
    let example = "a list of layers such as [{ conv = 16, kernel = 3, act = \"relu\" }, { maxpool = 2 }, \
                   { flatten = true }, { linear = 128, act = \"relu\" }, { dropout = 0.1 }, { linear = 10 }]";
    let list = match f.take(key) {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(v) => return Err(f.error(key, format!("expected {example}, found {}", describe(v)))),
        None => return Err(f.error(key, format!("missing; expected {example}"))),
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            let at = format!("{key}[{i}]");
            match v {
                Value::Table(t) => LayerSpec::read(&f.sub(&at, t)),
                other => Err(f.error(
                    &at,
                    format!(
                        "expected a layer table such as {{ linear = 10 }}, found {}",
                        describe(other)
                    ),
                )),
            }
        })
        .collect()
}
