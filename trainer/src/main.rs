//! The `cohort` binary.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("cohort: the trainer is not built yet")
}
