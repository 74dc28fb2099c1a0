//! `ModelSpec`: a model written as data (TOML, JSON), built into a [`Model`] of `M` members.

use std::collections::BTreeMap;

use cohort_tensor::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::nn::{
    Activation, ActivationKind, Conv2d, Dropout, Embedding, EmbeddingBag, Features, Flatten,
    LayerNorm, Linear, MaxPool2d, Module, Sequential, mix,
};
use crate::{Error, Param, Result, Tape, Var};

/// A stack of layers, e.g. in TOML
/// `layers = [{ conv = 16, kernel = 3, act = "relu" }, { maxpool = 2 }, { flatten = true }, { linear = 10 }]`.
/// The input's shape (per example) is given when building.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The layers, in order.
    pub layers: Vec<LayerSpec>,
}

/// One layer: exactly one kind key (`linear`, `conv`, `maxpool`, `flatten`, `embedding`, `embedding_bag`,
/// `layernorm`, `dropout`, or `act` alone) plus its options.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerSpec {
    /// Dense layer with this many outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear: Option<usize>,
    /// Convolution with this many output channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv: Option<usize>,
    /// Convolution kernel size (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<usize>,
    /// Convolution stride (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<usize>,
    /// Convolution zero padding (default `kernel / 2`, "same" at stride 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<usize>,
    /// Max pooling with this window (and stride).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxpool: Option<usize>,
    /// Flatten each example's features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flatten: Option<bool>,
    /// Embedding of this width (input: i32 token ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<usize>,
    /// Mean of embeddings of this width over each bag (input: i32 ids `[L]` per example).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_bag: Option<usize>,
    /// Vocabulary size of an embedding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
    /// Layer normalization over the last dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layernorm: Option<bool>,
    /// Layer norm epsilon (default 1e-5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    /// Dropout with this rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
    /// Activation after the layer (`relu`, `gelu`, `tanh`), or a layer of its own when alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<String>,
    /// Whether linear/conv layers have a bias (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<bool>,
    /// Anything else: reported as an unknown layer kind or option when building.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, SpecValue>,
}

/// A value of an unrecognized key (kept so that the error can name it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpecValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<SpecValue>),
    /// A table.
    Table(BTreeMap<String, SpecValue>),
}

/// The kinds a layer may have.
pub const LAYER_KINDS: &[&str] = &[
    "linear",
    "conv",
    "maxpool",
    "flatten",
    "embedding",
    "embedding_bag",
    "layernorm",
    "dropout",
    "act",
];

/// Per-example shape as the spec is walked.
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    /// Token ids `[..]` (i32).
    Tokens(Vec<usize>),
    /// Float features; the last dimension is the feature size.
    Dense(Vec<usize>),
    /// `[C, H, W]`.
    Image(usize, usize, usize),
}

impl Shape {
    fn dims(&self) -> Vec<usize> {
        match self {
            Shape::Tokens(d) | Shape::Dense(d) => d.clone(),
            Shape::Image(c, h, w) => vec![*c, *h, *w],
        }
    }
}

impl LayerSpec {
    /// The kind keys set on this layer (exactly one is valid; `act` counts only when alone).
    fn kinds(&self) -> Vec<&'static str> {
        let mut k = Vec::new();
        let set = [
            ("linear", self.linear.is_some()),
            ("conv", self.conv.is_some()),
            ("maxpool", self.maxpool.is_some()),
            ("flatten", self.flatten.is_some()),
            ("embedding", self.embedding.is_some()),
            ("embedding_bag", self.embedding_bag.is_some()),
            ("layernorm", self.layernorm.is_some()),
            ("dropout", self.dropout.is_some()),
        ];
        for (name, on) in set {
            if on {
                k.push(name);
            }
        }
        if k.is_empty() && self.act.is_some() {
            k.push("act");
        }
        k
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

impl ModelSpec {
    /// Parses a TOML document holding `layers = [...]`.
    ///
    /// # Errors
    /// When the text is not such a document (the message comes from the TOML parser).
    pub fn from_toml(text: &str) -> std::result::Result<ModelSpec, toml::de::Error> {
        toml::from_str(text)
    }

    /// Builds the model for examples of shape `input` (`[784]`, `[1, 28, 28]`, `[L]` of token ids).
    ///
    /// # Errors
    /// [`Error::Spec`] naming the layer (index and kind) for an unknown kind or option, a missing size, or a shape
    /// that does not fit; tensor errors from making the parameters.
    pub fn build(&self, input: &[usize], opts: &BuildOptions) -> Result<Model> {
        let m = opts.seeds.len();
        if m == 0 {
            return Err(Error::Spec {
                index: 0,
                kind: "model".into(),
                reason: "no members: give at least one seed".into(),
            });
        }
        let first_embeds = self
            .layers
            .first()
            .is_some_and(|l| l.embedding.is_some() || l.embedding_bag.is_some());
        let mut shape = match input {
            [] => {
                return Err(Error::Spec {
                    index: 0,
                    kind: "input".into(),
                    reason: "empty input shape".into(),
                });
            }
            _ if first_embeds => Shape::Tokens(input.to_vec()),
            [c, h, w] if matches!(self.layers.first(), Some(l) if l.conv.is_some() || l.maxpool.is_some()) => {
                Shape::Image(*c, *h, *w)
            }
            d => Shape::Dense(d.to_vec()),
        };
        let mut net = Sequential::new();
        let (dt, dev) = (opts.dtype, &opts.device);
        for (i, l) in self.layers.iter().enumerate() {
            let kinds = l.kinds();
            let kind = kinds.first().copied().unwrap_or("?").to_string();
            let err = |reason: String| Error::Spec {
                index: i,
                kind: kind.clone(),
                reason,
            };
            if let Some(k) = l.unknown.keys().next() {
                return Err(if kinds.is_empty() {
                    Error::Spec {
                        index: i,
                        kind: k.clone(),
                        reason: format!(
                            "unknown layer kind `{k}`; known kinds: {}",
                            LAYER_KINDS.join(", ")
                        ),
                    }
                } else {
                    err(format!("unknown option `{k}`"))
                });
            }
            if kinds.len() != 1 {
                return Err(err(if kinds.is_empty() {
                    format!("no layer kind; give one of {}", LAYER_KINDS.join(", "))
                } else {
                    format!(
                        "several kinds in one layer ({}); split them into separate layers",
                        kinds.join(", ")
                    )
                }));
            }
            let act = match &l.act {
                Some(a) => Some(ActivationKind::parse(a).ok_or_else(|| {
                    err(format!("unknown activation `{a}`; known: relu, gelu, tanh"))
                })?),
                None => None,
            };
            let gain = act.map_or(1.0, ActivationKind::gain);
            // Distinct seeds per layer, the same for member m whatever M is.
            let seeds: Vec<u64> = opts.seeds.iter().map(|&s| mix(s, i as u64 + 1)).collect();
            let is_image = matches!(shape, Shape::Image(..));
            match kinds[0] {
                "linear" => {
                    let out = l.linear.unwrap_or(0);
                    let inp = match &shape {
                        Shape::Dense(d) => *d.last().unwrap_or(&0),
                        other => {
                            return Err(err(format!(
                                "needs flat features, got {:?}{}",
                                other.dims(),
                                if is_image {
                                    "; add { flatten = true } before it"
                                } else {
                                    "; add an embedding first"
                                }
                            )));
                        }
                    };
                    if out == 0 || inp == 0 {
                        return Err(err(format!("sizes must be positive (in {inp}, out {out})")));
                    }
                    net.push(Linear::new(
                        inp,
                        out,
                        l.bias.unwrap_or(true),
                        gain,
                        &seeds,
                        dt,
                        dev,
                    )?);
                    if let Shape::Dense(d) = &mut shape {
                        *d.last_mut().unwrap_or(&mut 0) = out;
                    }
                }
                "conv" => {
                    let Shape::Image(c, h, w) = shape else {
                        return Err(err(format!(
                            "needs image input [C, H, W], got {:?} (give the input shape as [C, H, W])",
                            shape.dims()
                        )));
                    };
                    let (o, k, st) = (
                        l.conv.unwrap_or(0),
                        l.kernel.unwrap_or(3),
                        l.stride.unwrap_or(1),
                    );
                    let p = l.padding.unwrap_or(k / 2);
                    if o == 0 || k == 0 || st == 0 {
                        return Err(err(format!(
                            "channels, kernel and stride must be positive ({o}, {k}, {st})"
                        )));
                    }
                    if h + 2 * p < k || w + 2 * p < k {
                        return Err(err(format!(
                            "a {k}x{k} kernel does not fit the {h}x{w} input with padding {p}"
                        )));
                    }
                    net.push(Conv2d::new(c, o, k, st, p, gain, &seeds, dt, dev)?);
                    shape = Shape::Image(o, (h + 2 * p - k) / st + 1, (w + 2 * p - k) / st + 1);
                }
                "maxpool" => {
                    let Shape::Image(c, h, w) = shape else {
                        return Err(err(format!(
                            "needs image input [C, H, W], got {:?}",
                            shape.dims()
                        )));
                    };
                    let k = l.maxpool.unwrap_or(0);
                    if k == 0 || k > h || k > w {
                        return Err(err(format!(
                            "a {k}x{k} window does not fit the {h}x{w} input"
                        )));
                    }
                    net.push(MaxPool2d::new(k, k));
                    shape = Shape::Image(c, h / k, w / k);
                }
                "flatten" => {
                    if matches!(shape, Shape::Tokens(_)) {
                        return Err(err(
                            "token ids cannot be flattened; add an embedding first".into()
                        ));
                    }
                    net.push(Flatten::new(m));
                    shape = Shape::Dense(vec![shape.dims().iter().product()]);
                }
                "embedding" | "embedding_bag" => {
                    let Shape::Tokens(t) = &shape else {
                        return Err(err(
                            "must be the first layer (its input is i32 token ids)".into()
                        ));
                    };
                    let vocab = l
                        .vocab
                        .ok_or_else(|| err("needs `vocab = <size>`".into()))?;
                    if kinds[0] == "embedding" {
                        let d = l.embedding.unwrap_or(0);
                        net.push(Embedding::new(vocab, d, &seeds, dt, dev)?);
                        let mut s = t.clone();
                        s.push(d);
                        shape = Shape::Dense(s);
                    } else {
                        let d = l.embedding_bag.unwrap_or(0);
                        if t.len() != 1 {
                            return Err(err(format!(
                                "needs bags of ids [L] per example, got {t:?}"
                            )));
                        }
                        net.push(EmbeddingBag::new(vocab, d, &seeds, dt, dev)?);
                        shape = Shape::Dense(vec![d]);
                    }
                }
                "layernorm" => {
                    let Shape::Dense(d) = &shape else {
                        return Err(err(format!("needs dense features, got {:?}", shape.dims())));
                    };
                    net.push(LayerNorm::new(
                        *d.last().unwrap_or(&0),
                        l.eps.unwrap_or(1e-5),
                        m,
                        dt,
                        dev,
                    )?);
                }
                "dropout" => {
                    let p = l.dropout.unwrap_or(0.0);
                    net.push(
                        Dropout::new(p, seeds[0])
                            .map_err(|_| err(format!("rate {p} outside [0, 1)")))?,
                    );
                }
                "act" => {}
                other => return Err(err(format!("unknown layer kind `{other}`"))),
            }
            if let Some(a) = act {
                net.push(Activation(a));
            }
        }
        let params = net.params().into_iter().map(|(_, p)| p).collect();
        Ok(Model {
            spec: self.clone(),
            input: input.to_vec(),
            members: m,
            net,
            params,
            output: shape.dims(),
            dtype: dt,
            device: *dev,
        })
    }
}

/// A model of `M` members built from a [`ModelSpec`]: every parameter is `[M, ..]`.
#[derive(Debug)]
pub struct Model {
    spec: ModelSpec,
    input: Vec<usize>,
    members: usize,
    net: Sequential,
    params: Vec<Param>,
    output: Vec<usize>,
    dtype: DType,
    device: Device,
}

impl Model {
    /// The spec it was built from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Number of members `M`.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Per-example input shape.
    pub fn input_shape(&self) -> &[usize] {
        &self.input
    }

    /// Per-example output shape.
    pub fn output_shape(&self) -> &[usize] {
        &self.output
    }

    /// Parameter dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the parameters live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The layers.
    pub fn net(&self) -> &Sequential {
        &self.net
    }

    /// Parameters in a stable order, named `layers.<i>.<name>` ([`Param::name`]).
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Number of trainable values of one member.
    pub fn member_param_count(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.value().elem_count() / self.members)
            .sum()
    }

    /// Runs all members on a shared batch `x` (`[B, ..input]` or `[B, prod(input)]`; i32 ids for embeddings),
    /// giving `[M, B, ..output]`. Parameters are recorded on `tape` (use [`Tape::no_grad`] for inference).
    ///
    /// # Errors
    /// When `x` does not have the input's shape.
    pub fn forward(&self, tape: &Tape, x: &Tensor) -> Result<Var> {
        let s = x.shape();
        let per: usize = self.input.iter().product();
        let ok = !s.is_empty() && s[1..].iter().product::<usize>() == per;
        if !ok {
            return Err(Error::Shape {
                op: "model",
                reason: format!(
                    "batch {s:?} for examples of shape {:?}: expected [B, {:?}]",
                    self.input, self.input
                ),
            });
        }
        let mut shape = vec![s[0]];
        shape.extend_from_slice(&self.input);
        let xv = Var::constant(x.reshape(&shape)?);
        self.net
            .forward(tape, Features::shared(xv))?
            .into_members(self.members)
    }

    /// Runs member `m` on its own batch `x[m]` (`x`: `[M, B, ..input]`), giving `[M, B, ..output]`.
    ///
    /// # Errors
    /// When `x` does not have the input's shape.
    pub fn forward_members(&self, tape: &Tape, x: &Tensor) -> Result<Var> {
        let s = x.shape();
        let per: usize = self.input.iter().product();
        if s.len() < 2 || s[0] != self.members || s[2..].iter().product::<usize>() != per {
            return Err(Error::Shape {
                op: "model",
                reason: format!(
                    "per-member batch {s:?}: expected [{}, B, {:?}]",
                    self.members, self.input
                ),
            });
        }
        let mut shape = vec![s[0], s[1]];
        shape.extend_from_slice(&self.input);
        let xv = Var::constant(x.reshape(&shape)?);
        self.net
            .forward(tape, Features::members(xv))?
            .into_members(self.members)
    }

    /// Clears every parameter's accumulated gradient.
    pub fn zero_grad(&self) {
        self.params.iter().for_each(Param::zero_grad);
    }

    /// Every parameter, whole (`[M, ..]`), by name.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .map(|p| (p.name(), p.value().clone()))
            .collect()
    }

    /// Member `m`'s own parameters by name, without the member dimension (`layers.0.weight`: `[in, out]`): what a
    /// checkpoint of that member holds.
    ///
    /// # Errors
    /// When `m >= M`.
    pub fn member_state(&self, m: usize) -> Result<Vec<(String, Tensor)>> {
        self.params
            .iter()
            .map(|p| Ok((p.name(), p.member(m)?)))
            .collect()
    }

    /// Overwrites every parameter, whole (`[M, ..]`, as given by [`Model::state`]); tensors are moved and cast to
    /// the model's device and dtype.
    ///
    /// # Errors
    /// When a parameter is missing, unknown or has the wrong shape.
    pub fn load_state(&self, state: &[(String, Tensor)]) -> Result<()> {
        self.load_each(state, |p, t| p.set(t))
    }

    /// Writes member `m`'s parameters (as given by [`Model::member_state`], with or without a leading 1).
    ///
    /// # Errors
    /// When a parameter is missing, unknown or has the wrong shape.
    pub fn load_member(&self, m: usize, state: &[(String, Tensor)]) -> Result<()> {
        self.load_each(state, |p, t| p.set_member(m, t))
    }

    /// Checks that `state` names exactly this model's parameters, then hands each its tensor.
    fn load_each(
        &self,
        state: &[(String, Tensor)],
        load: impl Fn(&Param, &Tensor) -> Result<()>,
    ) -> Result<()> {
        for (name, _) in state {
            if !self.params.iter().any(|p| &p.name() == name) {
                return Err(Error::Param {
                    name: name.clone(),
                    reason: "not a parameter of this model".into(),
                });
            }
        }
        for p in &self.params {
            let name = p.name();
            let (_, t) = state
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| Error::Param {
                    name: name.clone(),
                    reason: "missing from the state".into(),
                })?;
            load(p, t)?;
        }
        Ok(())
    }
}
