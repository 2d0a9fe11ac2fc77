//! The policy's unit tests: configuration checks, the lexical check the
//! server runs, and the node's canonicalising resolve (on a temporary
//! tree with symbolic links).

use std::os::unix::fs::symlink;

use super::*;

fn policy(text: &str) -> Result<Policy, String> {
    let raw: RawPolicy = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    Policy::from_raw(&raw, &KeyPath::root().key("gateway").key("policy")).map_err(|e| e.to_string())
}

fn spec(text: &str) -> RuntimeSpec {
    RuntimeSpec::parse(text, false, "t").unwrap()
}

fn check(p: &Policy, text: &str) -> Result<(), String> {
    p.check_runtime(&spec(text), &KeyPath::root().key("runtime"))
        .map_err(|e| e.to_string())
}

#[test]
fn the_default_allows_nothing_beyond_the_safe() {
    let p = policy("").unwrap();
    assert_eq!(p, Policy::default());
    assert!(check(&p, "").is_ok());
    assert!(check(&p, "[[prepare]]\nrun = \"true\"").is_ok());
    for (text, want) in [
        (
            "[[prepare]]\nupload = { from = \"/etc/shadow\" }",
            "runtime.prepare[0].upload.from: /etc/shadow is outside the allowed upload roots []",
        ),
        (
            "[[post]]\nrun = \"x\"\n[[post]]\nupload = { from = \"/root\" }",
            "runtime.post[1].upload.from: /root is outside",
        ),
        (
            "[[mounts]]\nsource = \"/etc\"\ntarget = \"/e\"",
            "runtime.mounts[0].source: /etc is outside the allowed mount roots []",
        ),
        (
            "network = \"host\"",
            "runtime.network: \"host\" is not allowed",
        ),
        (
            "rootfs = \"/var/lib/polar\"",
            "runtime.rootfs: /var/lib/polar is outside the allowed rootfs roots []",
        ),
        (
            "kind = \"apptainer\"\nimage = \"/\"",
            "runtime.image: / is outside the allowed image roots []",
        ),
        (
            "[limits]\nmemory_bytes = 9000000000",
            "runtime.limits.memory_bytes: above the node's ceiling of 8589934592",
        ),
        (
            "[limits]\npids = 5000",
            "runtime.limits.pids: above the node's ceiling of 4096",
        ),
    ] {
        let e = check(&p, text).unwrap_err();
        assert!(e.starts_with(want), "{text:?}: {e}");
    }
    // Registry images are not host paths.
    assert!(check(&p, "kind = \"apptainer\"\nimage = \"docker://python:3.12\"").is_ok());
    assert!(check(&p, "kind = \"docker\"\nimage = \"python:3.12\"").is_ok());
    assert!(check(&p, "[limits]\ncpu = 64.0").is_ok());
}

#[test]
fn roots_compare_components_after_normalisation() {
    let p = policy(
        "upload_roots = [\"/srv/tasks/\"]\nmount_roots = [\"/data\"]\n\
         writable_mount_roots = [\"/scratch\"]\nallow_host_network = true\n\
         max_cpu = 2.0\nmax_memory_bytes = 1073741824",
    )
    .unwrap();
    assert_eq!(p.upload_roots, vec![PathBuf::from("/srv/tasks")]);
    assert!(check(&p, "[[prepare]]\nupload = { from = \"/srv/tasks/./t1\" }").is_ok());
    assert!(check(&p, "[[prepare]]\nupload = { from = \"/srv/tasks\" }").is_ok());
    let e = check(&p, "[[prepare]]\nupload = { from = \"/srv/tasks2/t1\" }").unwrap_err();
    assert!(
        e.contains("/srv/tasks2/t1 is outside the allowed upload roots [/srv/tasks]"),
        "{e}"
    );
    assert!(check(&p, "[[mounts]]\nsource = \"/data/a\"\ntarget = \"/a\"").is_ok());
    // A read-only root does not allow a writable mount; a writable root
    // allows both.
    let e = check(
        &p,
        "[[mounts]]\nsource = \"/data/a\"\ntarget = \"/a\"\nread_only = false",
    )
    .unwrap_err();
    assert!(
        e.starts_with("runtime.mounts[0].source: /data/a is outside the allowed writable mount roots [/scratch]"),
        "{e}"
    );
    assert!(
        check(
            &p,
            "[[mounts]]\nsource = \"/scratch/a\"\ntarget = \"/a\"\nread_only = false"
        )
        .is_ok()
    );
    assert!(check(&p, "[[mounts]]\nsource = \"/scratch\"\ntarget = \"/a\"").is_ok());
    assert!(check(&p, "network = \"host\"").is_ok());
    let e = check(&p, "[limits]\ncpu = 2.5").unwrap_err();
    assert!(e.starts_with("runtime.limits.cpu: above"), "{e}");
    let e = check(&p, "[limits]\nmemory_bytes = 1073741825").unwrap_err();
    assert!(e.starts_with("runtime.limits.memory_bytes"), "{e}");
}

#[test]
fn budgets_have_ceilings() {
    let p = policy("max_session_secs = 600\nmax_agent_timeout_secs = 300").unwrap();
    assert!(p.check_budgets(600, Some(300)).is_ok());
    assert!(p.check_budgets(600, None).is_ok());
    let e = p.check_budgets(601, None).unwrap_err().to_string();
    assert_eq!(e, "timeout_secs: above the node's ceiling of 600 seconds");
    let e = p.check_budgets(60, Some(301)).unwrap_err().to_string();
    assert!(e.starts_with("agent.options.timeout_secs: above"), "{e}");
    let d = Policy::default();
    assert!(d.check_budgets(86_400, Some(86_400)).is_ok());
    assert!(d.check_budgets(86_401, None).is_err());
}

#[test]
fn configuration_errors_name_the_key() {
    for (text, want) in [
        (
            "upload_roots = [\"/a\", \"rel\"]",
            "gateway.policy.upload_roots[1]: \"rel\" must be an absolute",
        ),
        (
            "mount_roots = [\"/a/../etc\"]",
            "gateway.policy.mount_roots[0]:",
        ),
        (
            "upload_roots = [\"/srv\"]\nwritable_mount_roots = [\"/tmp\", \"/srv/scratch\"]",
            "gateway.policy.writable_mount_roots[1]: /srv/scratch overlaps upload_roots[0] (/srv)",
        ),
        (
            "rootfs_roots = [\"/srv/rootfs/a\"]\nwritable_mount_roots = [\"/srv/rootfs\"]",
            "gateway.policy.writable_mount_roots[0]: /srv/rootfs overlaps rootfs_roots[0]",
        ),
        (
            "image_roots = [\"/img\"]\nwritable_mount_roots = [\"/img\"]",
            "gateway.policy.writable_mount_roots[0]: /img overlaps image_roots[0]",
        ),
        ("max_pids = 2", "gateway.policy.max_pids: at least 8"),
        ("max_memory_bytes = 5", "gateway.policy.max_memory_bytes:"),
        ("max_cpu = 0.0", "gateway.policy.max_cpu:"),
        ("max_session_secs = 0", "gateway.policy.max_session_secs:"),
        (
            "max_agent_timeout_secs = 0",
            "gateway.policy.max_agent_timeout_secs:",
        ),
        (
            "allow_pass_routes = true",
            "unknown field `allow_pass_routes`",
        ),
    ] {
        let e = policy(text).unwrap_err();
        assert!(e.starts_with(want) || e.contains(want), "{text:?}: {e}");
    }
    // A read-only mount root may overlap a writable one.
    assert!(policy("mount_roots = [\"/d\"]\nwritable_mount_roots = [\"/d/w\"]").is_ok());
    let p = policy("upload_roots = [\"/var/lib\"]\nmount_roots = [\"/srv\"]").unwrap();
    let key = KeyPath::root().key("gateway").key("policy");
    let e = p
        .check_protected(&key, &[("state directory", Path::new("/var/lib/polar"))])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("gateway.policy.upload_roots[0]: /var/lib holds or is inside the node's state directory (/var/lib/polar)"),
        "{e}"
    );
    let e = p
        .check_protected(&key, &[("config file", Path::new("/srv/polar.toml"))])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("gateway.policy.mount_roots[0]:"), "{e}");
    assert!(
        p.check_protected(&key, &[("state directory", Path::new("/var/polar"))])
            .is_ok()
    );
}

/// A temporary tree: `allowed/` (an upload and mount root) holding a
/// task, a symbolic link out of it, and `link-root -> allowed`.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("polar-policy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("allowed/task")).unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::fs::write(d.join("outside/secret"), "s").unwrap();
        symlink(d.join("outside/secret"), d.join("allowed/escape")).unwrap();
        symlink(d.join("allowed"), d.join("link-root")).unwrap();
        std::fs::create_dir_all(d.join("allowed/a:b")).unwrap();
        symlink(d.join("allowed/a:b"), d.join("allowed/colon")).unwrap();
        Self(d)
    }

    fn p(&self, rel: &str) -> String {
        self.0.join(rel).display().to_string()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_node_resolves_symbolic_links_and_uses_the_canonical_path() {
    let t = Tree::new("resolve");
    let p = policy(&format!(
        "upload_roots = [{:?}]\nmount_roots = [{:?}]",
        t.p("link-root"),
        t.p("link-root")
    ))
    .unwrap();
    let base = KeyPath::root().key("runtime");
    // Through the root's own link: allowed, and the canonical path is used.
    let mut s = spec(&format!(
        "[[prepare]]\nupload = {{ from = {:?} }}\n[[mounts]]\nsource = {:?}\ntarget = \"/t\"",
        t.p("link-root/task"),
        t.p("link-root/task")
    ));
    p.resolve(&mut s, &base).unwrap();
    let canon = std::fs::canonicalize(t.0.join("allowed/task")).unwrap();
    assert_eq!(
        s.prepare[0],
        Step::Upload {
            from: canon.clone(),
            to: PathBuf::from("."),
            replace: false,
        }
    );
    assert_eq!(s.mounts[0].source, canon);
    // Missing limits get the ceilings.
    assert_eq!(s.limits.memory_bytes, Some(DEFAULT_MAX_MEMORY_BYTES));
    assert_eq!(s.limits.pids, Some(DEFAULT_MAX_PIDS));
    assert_eq!(s.limits.cpu, None);
    // A link inside the root pointing out of it is refused.
    let mut s = spec(&format!(
        "[[prepare]]\nrun = \"true\"\n[[prepare]]\nupload = {{ from = {:?} }}",
        t.p("link-root/escape")
    ));
    let e = p.resolve(&mut s, &base).unwrap_err().to_string();
    let secret = std::fs::canonicalize(t.0.join("outside/secret")).unwrap();
    assert!(
        e.starts_with(&format!(
            "runtime.prepare[1].upload.from: {} is outside the allowed upload roots",
            secret.display()
        )),
        "{e}"
    );
    // A path that does not exist is named.
    let mut s = spec(&format!(
        "[[mounts]]\nsource = {:?}\ntarget = \"/t\"",
        t.p("link-root/nope")
    ));
    let e = p.resolve(&mut s, &base).unwrap_err().to_string();
    assert!(
        e.starts_with("runtime.mounts[0].source:") && e.contains("cannot be resolved"),
        "{e}"
    );
    // Outside lexically: refused before it is looked at.
    let mut s = spec(&format!(
        "[[prepare]]\nupload = {{ from = {:?} }}",
        t.p("outside/secret")
    ));
    assert!(p.resolve(&mut s, &base).is_err());
}

#[test]
fn a_canonical_path_the_runtime_s_mount_syntax_cannot_carry_is_refused() {
    let t = Tree::new("syntax");
    let p = policy(&format!("mount_roots = [{:?}]", t.p("allowed"))).unwrap();
    let base = KeyPath::root().key("runtime");
    // `colon` itself is fine for apptainer; where it points is not.
    let mut s = spec(&format!(
        "kind = \"apptainer\"\nimage = \"docker://x\"\n[[mounts]]\nsource = {:?}\ntarget = \"/t\"",
        t.p("allowed/colon")
    ));
    let e = p.resolve(&mut s, &base).unwrap_err().to_string();
    assert!(
        e.starts_with("runtime.mounts[0].source: its canonical path") && e.contains("holds `:`"),
        "{e}"
    );
    // Docker can carry a `:` (its --mount value is key=value CSV).
    let mut s = spec(&format!(
        "kind = \"docker\"\nimage = \"x\"\n[[mounts]]\nsource = {:?}\ntarget = \"/t\"",
        t.p("allowed/colon")
    ));
    p.resolve(&mut s, &base).unwrap();
}
