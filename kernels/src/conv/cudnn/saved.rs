//! cuDNN's decisions as [`ConvChoices`]: exported with the products' choices for a run to save, and adopted by the
//! process that resumes it, which then runs every convolution it met before on the same algorithm without timing.

use super::{
    Choice, Desc, Dnn, Entry, IMPLICIT_PRECOMP_GEMM, Key, Layout, Picked, Staging, Variant,
    policy_math, run_math,
};
use crate::conv::{ConvChoice, ConvChoices, ConvDecision, ConvPass};

impl Dnn {
    /// Entries made, changed or adopted so far.
    pub(crate) fn decisions(&self) -> u64 {
        self.table.made()
    }

    /// Every decision, in a fixed order.
    pub(crate) fn choices(&self) -> ConvChoices {
        let mut entries: Vec<ConvChoice> = self
            .table
            .iter()
            .map(|(k, e)| ConvChoice {
                pass: k.pass,
                params: k.p,
                math: k.math,
                decision: match e {
                    Entry::Own => ConvDecision::Own,
                    Entry::Run(c) => ConvDecision::Cudnn {
                        algo: c.run.algo,
                        workspace: c.run.workspace,
                        fused_bias: c.run.fused,
                        channels_last: c.run.layout == Layout::Nhwc,
                        in_f32: c.run.layout == Layout::F32,
                        math_type: Some(c.run.math_type as u32),
                    },
                },
            })
            .collect();
        entries.sort_by_key(|e| (e.pass, e.params, e.math));
        ConvChoices {
            cudnn_version: self.version as u64,
            entries,
        }
    }

    /// Takes `choices` for the keys this state has not decided on yet (those it has keep their entry: work may be
    /// queued or captured on them), never to be timed; returns how many it took. Choices of another cuDNN version
    /// are all left out, and so is an entry this cuDNN rejects: its key is chosen afresh when met.
    pub(crate) fn adopt(&mut self, choices: &ConvChoices) -> usize {
        if choices.entries.is_empty() {
            return 0;
        }
        if choices.cudnn_version != self.version as u64 {
            tracing::warn!(
                "convolution choices were made with cuDNN {}, this is cuDNN {}: none adopted, the convolutions \
                 will be chosen afresh",
                super::version_string(choices.cudnn_version as usize),
                super::version_string(self.version)
            );
            return 0;
        }
        let saved: Vec<_> = choices
            .entries
            .iter()
            .map(|c| {
                let key = Key {
                    pass: c.pass,
                    p: c.params,
                    math: c.math,
                };
                let entry = self
                    .entry(&key, &c.decision)
                    .ok_or_else(|| format!("{} ({:?})", super::label(&key), c.decision));
                (key, entry)
            })
            .collect();
        self.table.adopt("convolution", saved)
    }

    /// The entry `decision` makes for `key`, where it can run: an algorithm the heuristics report as supported for
    /// the geometry in its layout and math type (the layout's policy's own where none was saved), needing no more workspace
    /// than saved, fused only where cuDNN allows it (NCHW).
    fn entry(&self, key: &Key, decision: &ConvDecision) -> Option<Entry> {
        let ConvDecision::Cudnn {
            algo,
            workspace,
            fused_bias,
            channels_last,
            in_f32,
            math_type,
        } = *decision
        else {
            return Some(Entry::Own);
        };
        let layout = match (channels_last, in_f32) {
            (false, false) => Layout::Nchw,
            (true, false) => Layout::Nhwc,
            (false, true) => Layout::F32,
            (true, true) => return None,
        };
        let listed = key.listed_as(layout);
        if fused_bias
            && (key.pass != (ConvPass::Forward { bias: true })
                || algo != IMPLICIT_PRECOMP_GEMM
                || layout != Layout::Nchw)
        {
            return None;
        }
        let math_type = match math_type {
            Some(saved) => run_math(listed.math, saved)?,
            None => policy_math(listed.math),
        };
        let desc = Desc::new(key)?;
        let views = desc.views(layout)?;
        let found = self
            .candidates(&listed, desc.conv, views)
            .into_iter()
            .find(|c| c.algo == algo && run_math(listed.math, c.math_type) == Some(math_type))?;
        let need = self
            .workspace_size(key.pass, (desc.conv, math_type), views, algo)
            .ok()?
            + Staging::new(layout, &key.p, key.math).bytes();
        // Within the cap fresh choices keep to: an edited file asks for no more memory than a timed choice could.
        (need <= workspace && workspace <= super::workspace_cap(&key.p)).then(|| {
            Entry::Run(Choice {
                desc,
                run: Variant {
                    algo,
                    workspace,
                    fused: fused_bias,
                    deterministic: found.determinism == super::DETERMINISTIC,
                    layout,
                    math_type,
                },
                picked: Picked::Adopted,
                ran: false,
            })
        })
    }
}
