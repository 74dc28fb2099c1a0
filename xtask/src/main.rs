//! Developer tasks: `cargo xtask bench`, `cargo xtask gpu-bundle`.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("xtask: no task yet")
}
