//! Where compiled GPU kernels are kept between runs. The kernels crate caches what it is told to; choosing the
//! folder is file layout, which is the trainer's to decide: `COHORT_KERNEL_CACHE` (a folder, or `off`), else
//! `$XDG_CACHE_HOME/cohort/kernels`, else `~/.cache/cohort/kernels`.

use std::path::PathBuf;

/// Tells the kernels crate the folder from the environment.
pub(crate) fn configure() {
    cohort_tensor::set_kernel_cache(folder(|k| std::env::var_os(k).map(PathBuf::from)));
}

/// The folder the variables `var` reads name; `None`: keep no disk cache.
fn folder(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    match var("COHORT_KERNEL_CACHE") {
        Some(p) if p.as_os_str() == "off" => None,
        Some(p) if !p.as_os_str().is_empty() => Some(p),
        _ => var("XDG_CACHE_HOME")
            .filter(|p| p.is_absolute())
            .map(|p| p.join("cohort/kernels"))
            .or_else(|| var("HOME").map(|h| h.join(".cache/cohort/kernels"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<PathBuf> + use<> {
        let pairs: Vec<(String, PathBuf)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_folder_follows_the_environment() {
        let home = ("HOME", "/home/u");
        assert_eq!(
            folder(env(&[home])),
            Some("/home/u/.cache/cohort/kernels".into())
        );
        let xdg = env(&[home, ("XDG_CACHE_HOME", "/var/cache/u")]);
        assert_eq!(folder(xdg), Some("/var/cache/u/cohort/kernels".into()));
        // A relative XDG_CACHE_HOME is invalid by the spec and ignored.
        let rel = env(&[home, ("XDG_CACHE_HOME", "cache")]);
        assert_eq!(folder(rel), Some("/home/u/.cache/cohort/kernels".into()));
        let own = env(&[home, ("COHORT_KERNEL_CACHE", "/tmp/kc")]);
        assert_eq!(folder(own), Some("/tmp/kc".into()));
        assert_eq!(folder(env(&[home, ("COHORT_KERNEL_CACHE", "off")])), None);
        assert_eq!(folder(env(&[])), None);
    }
}
