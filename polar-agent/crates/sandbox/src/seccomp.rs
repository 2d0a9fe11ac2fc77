//! The native runtime's seccomp filter: which system calls a sandboxed
//! process may not make, compiled to classic BPF with `seccompiler` and
//! handed to bubblewrap (`--add-seccomp-fd FD`, one memfd per program),
//! which loads it last, after it has built the namespaces, right before it
//! execs the sandboxed command. Everything the command starts inherits it.
//!
//! Denied with `EPERM` ([`DENIED`], unconditionally): `ptrace` and
//! `process_vm_readv`/`writev` (reading or steering another process; in
//! particular bubblewrap's own pid-1 reaper, which runs *without* the
//! filter, so a traced reaper would be a way around it — hence all of
//! `ptrace`, `PTRACE_TRACEME` included: alone it grants nothing, since the
//! tracer would need `ptrace` too), every mount call (`mount`, `umount2`,
//! `pivot_root`, the new mount API `open_tree`/`move_mount`/`fsopen`/
//! `fsconfig`/`fsmount`/`fspick`/`mount_setattr`), `setns`, `bpf`,
//! `perf_event_open`, the keyring (`keyctl`, `add_key`, `request_key`),
//! `kexec_*`, module loading, `userfaultfd` (the classic tool for winning
//! kernel races), `open_by_handle_at`/`name_to_handle_at` (opening files
//! by inode, around the mount tree), `reboot`, `swapon`/`swapoff`, `acct`,
//! `quotactl*`, `lookup_dcookie`, `io_uring_*` (its operations bypass
//! seccomp, and it has been the largest source of kernel exploits of late;
//! libuv, Bun and Tokio fall back to threads when it is refused) and, on
//! x86_64, `iopl`/`ioperm`.
//!
//! Denied with `EPERM` by argument: `clone` and `unshare` asking for any
//! new namespace (`CLONE_NEWUSER`, `NEWNS`, `NEWPID`, `NEWNET`, `NEWUTS`,
//! `NEWIPC`, `NEWCGROUP`, and `NEWTIME` for `unshare`); threads and forks
//! are untouched. `personality` other than the default (`PER_LINUX`) or
//! the query `0xffffffff` (turning off ASLR helps an exploit).
//!
//! Socket address families are an allow-list ([`FAMILIES`]): `socket` and
//! `socketpair` with any other family get `EAFNOSUPPORT` (what the kernel
//! answers for a family it does not have, so programs that probe fall
//! back), and a netlink socket of any protocol but `NETLINK_ROUTE` gets
//! `EPROTONOSUPPORT`. The family and protocol are `int`s: only their low
//! 32 bits are compared, as the kernel reads them. Why these four and
//! nothing else (`AF_VSOCK` is not isolated by network namespaces; the
//! rest are kernel attack surface no harness uses): docs/SECURITY.md,
//! "Socket families".
//!
//! `clone3` gets `ENOSYS`: its flags are behind a pointer the filter cannot
//! read, and `ENOSYS` is what makes glibc, musl and Go fall back to
//! `clone`, which is checked.
//!
//! Why `EPERM` rather than killing the process: the call does not happen
//! either way, and `EPERM` is what the kernel itself answers an
//! unprivileged caller, so the programs that probe for these (Node and Bun
//! try `io_uring` and `userfaultfd`, shells try `personality`) fall back
//! instead of crashing the harness and losing the rollout. A call from a
//! foreign architecture (the 32-bit `int 0x80` entry on x86_64) kills the
//! process (`seccompiler`'s architecture check); so that the x32 ABI
//! (syscall numbers with bit 30 set, same audit architecture) cannot
//! reach the denied calls by other numbers, a four-instruction program
//! ([`x32_guard`]) answers every x32 call with `ENOSYS` — hand-written
//! because `seccompiler` matches exact numbers, not ranges.
//!
//! Building the programs is pure and unit-tested with a small BPF
//! interpreter below; [`memfds`] is the only part that touches the kernel.
//!
//! The docker runtime gets the same filter as a seccomp profile
//! ([`docker_profile`], for `--security-opt seccomp=FILE`), which runc
//! compiles with libseccomp: the same calls denied with the same errors
//! by the same arguments, built from the same tables; only the profile's
//! architecture list (the native one alone, so a 32-bit or x32 call gets
//! the profile's bad-architecture answer) stands for [`x32_guard`].

use std::collections::BTreeMap;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// Errors of building or passing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// `seccompiler` refused the filter (a bug here).
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    /// The memfd holding a program could not be made or written.
    #[error("passing the seccomp filter to bubblewrap: {0}")]
    Io(#[from] std::io::Error),
}

/// The architecture the filter is built for (the one Polar runs on).
#[cfg(target_arch = "x86_64")]
pub const ARCH: TargetArch = TargetArch::x86_64;
/// The architecture the filter is built for (the one Polar runs on).
#[cfg(target_arch = "aarch64")]
pub const ARCH: TargetArch = TargetArch::aarch64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the native runtime's seccomp filter supports x86_64 and aarch64");

/// System calls denied with `EPERM` whatever their arguments.
pub const DENIED: &[(&str, libc::c_long)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("setns", libc::SYS_setns),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
];

/// The `clone` flags that make a new namespace (`CLONE_NEWTIME` shares its
/// bit with the exit signal in `clone`, so it is only checked in
/// `unshare`).
pub const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// The socket address families a sandbox may open: Unix sockets, IPv4,
/// IPv6, and netlink (for `NETLINK_ROUTE` alone: glibc's `getaddrinfo`
/// with `AI_ADDRCONFIG` and `getifaddrs`, which Node's and Python's
/// interface listing use).
pub const FAMILIES: &[(&str, u64)] = &[
    ("AF_UNIX", libc::AF_UNIX as u64),
    ("AF_INET", libc::AF_INET as u64),
    ("AF_INET6", libc::AF_INET6 as u64),
    ("AF_NETLINK", libc::AF_NETLINK as u64),
];

/// The one netlink protocol allowed: `NETLINK_ROUTE`.
pub const NETLINK_ROUTE: u64 = libc::NETLINK_ROUTE as u64;

/// `personality` values allowed: `PER_LINUX` and the query.
const PERSONALITY_OK: [u64; 2] = [0, 0xffff_ffff];

/// x32 system calls have this bit set in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        op,
        value,
    )?)
}

/// One rule per flag: "flag `f` is set in argument 0" (rules are or-ed).
fn any_flag(flags: &[u64]) -> Result<Vec<SeccompRule>, SeccompError> {
    flags
        .iter()
        .map(|f| {
            Ok(SeccompRule::new(vec![cond(
                0,
                SeccompCmpOp::MaskedEq(*f),
                *f,
            )?])?)
        })
        .collect()
}

/// The `EPERM` program: [`DENIED`], and `clone`, `unshare` and
/// `personality` by argument.
pub fn eperm_program(arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    rules.insert(libc::SYS_clone, any_flag(NAMESPACE_FLAGS)?);
    let mut unshare = NAMESPACE_FLAGS.to_vec();
    unshare.push(libc::CLONE_NEWTIME as u64);
    rules.insert(libc::SYS_unshare, any_flag(&unshare)?);
    // Personality is an int: compare the low 32 bits only.
    let personality = PERSONALITY_OK
        .iter()
        .map(|v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *v))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(personality)?]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// [`DENIED`], the namespace flags of `clone` and `unshare`, `personality`,
/// the socket families and `clone3` as a docker (runc, libseccomp) seccomp profile: everything
/// else allowed, which docker's own profile would not be (the native
/// runtime's threat model is the one both runtimes answer to).
///
/// A libseccomp rule compares each argument at most once, and of two
/// rules matching one call the deny wins, so `personality` other than
/// `PER_LINUX` (0) and the query (`0xffffffff`) is denied as "two adjacent
/// bits of the 32-bit persona differ" (62 masked rules): true of every
/// 32-bit value but all zeros and all ones.
pub fn docker_profile() -> serde_json::Value {
    use serde_json::json;
    let eperm = libc::EPERM;
    let mut rules = vec![json!({
        "names": DENIED.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": eperm,
    })];
    // Denied when argument 0 masked with `mask` equals `value`.
    let masked = |name: &str, mask: u64, value: u64| {
        json!({
            "names": [name],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": eperm,
            "args": [{"index": 0, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}],
        })
    };
    rules.extend(NAMESPACE_FLAGS.iter().map(|f| masked("clone", *f, *f)));
    rules.extend(
        NAMESPACE_FLAGS
            .iter()
            .chain([&(libc::CLONE_NEWTIME as u64)])
            .map(|f| masked("unshare", *f, *f)),
    );
    debug_assert_eq!(PERSONALITY_OK, [0, 0xffff_ffff]);
    for bit in 0..31 {
        rules.push(masked("personality", 0b11 << bit, 0b01 << bit));
        rules.push(masked("personality", 0b11 << bit, 0b10 << bit));
    }
    rules.extend(docker_family_rules());
    rules.push(json!({
        "names": ["clone3"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": libc::ENOSYS,
    }));
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [DOCKER_ARCH],
        "syscalls": rules,
    })
}

/// The socket rules of [`docker_profile`]: [`family_program`] and
/// [`netlink_program`] written with `SCMP_CMP_MASKED_EQ` alone (a
/// libseccomp rule compares an argument once, so "none of four values"
/// cannot be one rule). The low 32 bits of the family are refused when they
/// equal a value below 64 outside [`FAMILIES`], or when any bit from 6 up is
/// set (every value of 64 or more): together, every family but the allowed
/// ones, whatever the kernel adds later. A netlink protocol is refused when
/// any of its 32 bits is set (every protocol but `NETLINK_ROUTE`, 0).
fn docker_family_rules() -> Vec<serde_json::Value> {
    use serde_json::json;
    const LOW: u64 = 0xffff_ffff;
    let arg = |index: u32, mask: u64, value: u64| json!({"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"});
    let rule = |names: &[&str], errno: i32, args: Vec<serde_json::Value>| json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno, "args": args});
    let both = ["socket", "socketpair"];
    let allowed: Vec<u64> = FAMILIES.iter().map(|(_, f)| *f).collect();
    let mut out: Vec<serde_json::Value> = (0..64)
        .filter(|f| !allowed.contains(f))
        .map(|f| rule(&both, libc::EAFNOSUPPORT, vec![arg(0, LOW, f)]))
        .collect();
    out.extend(
        (6..32).map(|bit| rule(&both, libc::EAFNOSUPPORT, vec![arg(0, 1 << bit, 1 << bit)])),
    );
    debug_assert_eq!(NETLINK_ROUTE, 0);
    out.extend((0..32).map(|bit| {
        rule(
            &["socket"],
            libc::EPROTONOSUPPORT,
            vec![
                arg(0, LOW, libc::AF_NETLINK as u64),
                arg(2, 1 << bit, 1 << bit),
            ],
        )
    }));
    out
}

/// The profile's architecture.
#[cfg(target_arch = "x86_64")]
const DOCKER_ARCH: &str = "SCMP_ARCH_X86_64";
/// The profile's architecture.
#[cfg(target_arch = "aarch64")]
const DOCKER_ARCH: &str = "SCMP_ARCH_AARCH64";

/// The `EAFNOSUPPORT` program: `socket` and `socketpair` with a family
/// outside [`FAMILIES`].
pub fn family_program(arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let outside = || -> Result<SeccompRule, SeccompError> {
        let conds = FAMILIES
            .iter()
            .map(|(_, f)| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SeccompRule::new(conds)?)
    };
    let rules = BTreeMap::from([
        (libc::SYS_socket, vec![outside()?]),
        (libc::SYS_socketpair, vec![outside()?]),
    ]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// The `EPROTONOSUPPORT` program: a netlink `socket` of any protocol but
/// [`NETLINK_ROUTE`].
pub fn netlink_program(arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let dword = |arg, op, v| SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v);
    let rule = SeccompRule::new(vec![
        dword(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
        dword(2, SeccompCmpOp::Ne, NETLINK_ROUTE)?,
    ])?;
    let rules = BTreeMap::from([(libc::SYS_socket, vec![rule])]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPROTONOSUPPORT as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// The `ENOSYS` program: `clone3`.
pub fn enosys_program(arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// Answers every x32 system call with `ENOSYS` (x86_64 only).
pub fn x32_guard() -> BpfProgram {
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JGE | BPF_K, BPF_RET | BPF_K.
    const LD_W_ABS: u16 = 0x20;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // Offset 0 of seccomp_data: the system call number.
        ins(LD_W_ABS, 0, 0, 0),
        ins(JGE_K, 0, 1, X32_SYSCALL_BIT),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Every program of the filter for `arch`, in the order they are loaded.
pub fn programs(arch: TargetArch) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut out = vec![
        eperm_program(arch)?,
        enosys_program(arch)?,
        family_program(arch)?,
        netlink_program(arch)?,
    ];
    if arch == TargetArch::x86_64 {
        out.push(x32_guard());
    }
    Ok(out)
}

/// A program as the kernel reads it (`struct sock_filter[]`), the form
/// bubblewrap expects on its descriptor.
pub fn to_bytes(program: &[sock_filter]) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for i in program {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

/// The compiled programs for [`ARCH`] (built once).
fn compiled() -> Result<&'static [Vec<u8>], SeccompError> {
    static COMPILED: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    if let Some(c) = COMPILED.get() {
        return Ok(c);
    }
    let built: Vec<Vec<u8>> = programs(ARCH)?.iter().map(|p| to_bytes(p)).collect();
    Ok(COMPILED.get_or_init(|| built))
}

/// One close-on-exec memfd per program, positioned at its start, for one
/// bubblewrap (it reads each to its end, so they are not reused). The
/// descriptors must be inherited by bubblewrap (see
/// [`super::process::Isolation::keep_fds`]).
pub fn memfds() -> Result<Vec<OwnedFd>, SeccompError> {
    compiled()?
        .iter()
        .map(|bytes| {
            // SAFETY: a plain syscall with a NUL-terminated name; the
            // descriptor it returns is owned by nothing else.
            let fd = unsafe { libc::memfd_create(c"polar-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            // SAFETY: `fd` was just returned by memfd_create.
            let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            file.write_all(bytes)?;
            file.seek(SeekFrom::Start(0))?;
            Ok(OwnedFd::from(file))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct seccomp_data` for a call.
    struct Call {
        nr: i64,
        arch: u32,
        args: [u64; 6],
    }

    impl Call {
        fn new(nr: i64, args: &[u64]) -> Self {
            let mut a = [0u64; 6];
            a[..args.len()].copy_from_slice(args);
            Self {
                nr,
                arch: audit_arch(ARCH),
                args: a,
            }
        }

        fn word(&self, offset: u32) -> u32 {
            match offset {
                0 => self.nr as u32,
                4 => self.arch,
                16..=63 => {
                    let arg = self.args[((offset - 16) / 8) as usize];
                    if offset.is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                _ => panic!("load at {offset}"),
            }
        }
    }

    fn audit_arch(arch: TargetArch) -> u32 {
        match arch {
            TargetArch::x86_64 => 62 | 0x8000_0000 | 0x4000_0000,
            TargetArch::aarch64 => 183 | 0x8000_0000 | 0x4000_0000,
            TargetArch::riscv64 => 243 | 0x8000_0000 | 0x4000_0000,
        }
    }

    /// Runs one classic-BPF program (the instructions seccompiler emits).
    fn run(program: &[sock_filter], call: &Call) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = &program[pc];
            pc += 1;
            let jump = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
            match i.code {
                0x20 => a = call.word(i.k),
                0x54 => a &= i.k,
                0x05 => pc += i.k as usize,
                0x15 => pc += jump(a == i.k),
                0x25 => pc += jump(a > i.k),
                0x35 => pc += jump(a >= i.k),
                0x06 => return i.k,
                code => panic!("instruction {code:#x} not interpreted"),
            }
        }
    }

    /// What the kernel does with all programs loaded: the most restrictive
    /// action wins (the lowest as a signed action value).
    fn verdict(call: &Call) -> u32 {
        programs(ARCH)
            .unwrap()
            .iter()
            .map(|p| run(p, call))
            .min_by_key(|r| (r & libc::SECCOMP_RET_ACTION_FULL) as i32)
            .unwrap()
    }

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn every_denied_call_gets_eperm_and_ordinary_calls_pass() {
        assert!(DENIED.len() >= 35);
        for (name, nr) in DENIED {
            assert_eq!(verdict(&Call::new(*nr, &[0, 0])), EPERM, "{name}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_getpid,
            libc::SYS_mmap,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_wait4,
        ] {
            assert_eq!(verdict(&Call::new(nr, &[1, 2, 3])), ALLOW, "syscall {nr}");
        }
    }

    /// Whether the docker profile denies `name` with argument 0 `arg0`
    /// (its rules read as libseccomp does: any matching deny wins).
    fn profile_denies(profile: &serde_json::Value, name: &str, arg0: u64) -> Option<i64> {
        profile_denies_args(profile, name, &[arg0])
    }

    /// [`profile_denies`] with the arguments `args` (by index).
    fn profile_denies_args(profile: &serde_json::Value, name: &str, args: &[u64]) -> Option<i64> {
        profile["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|r| {
                let named = r["names"].as_array().unwrap().iter().any(|n| n == name);
                let conds = r["args"].as_array().map_or(&[][..], Vec::as_slice);
                let matches = conds.iter().all(|a| {
                    let (i, m, v) = (
                        a["index"].as_u64().unwrap() as usize,
                        a["value"].as_u64().unwrap(),
                        a["valueTwo"].as_u64().unwrap(),
                    );
                    assert_eq!(a["op"], "SCMP_CMP_MASKED_EQ");
                    args.get(i).copied().unwrap_or(0) & m == v
                });
                (named && matches && r["action"] == "SCMP_ACT_ERRNO")
                    .then(|| r["errnoRet"].as_i64().unwrap())
            })
    }

    #[test]
    fn the_docker_profile_denies_what_the_native_filter_denies() {
        let p = docker_profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(p["architectures"], serde_json::json!([DOCKER_ARCH]));
        let eperm = i64::from(libc::EPERM);
        for (name, _) in DENIED {
            assert_eq!(profile_denies(&p, name, 0), Some(eperm), "{name}");
        }
        assert_eq!(
            profile_denies(&p, "clone3", 0),
            Some(i64::from(libc::ENOSYS))
        );
        for f in NAMESPACE_FLAGS {
            assert_eq!(profile_denies(&p, "clone", *f | 17), Some(eperm));
            assert_eq!(profile_denies(&p, "unshare", *f), Some(eperm));
        }
        assert_eq!(
            profile_denies(&p, "unshare", libc::CLONE_NEWTIME as u64),
            Some(eperm)
        );
        // Threads and forks pass.
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD) as u64;
        assert_eq!(profile_denies(&p, "clone", thread), None);
        assert_eq!(profile_denies(&p, "clone", 17), None);
        assert_eq!(
            profile_denies(&p, "unshare", libc::CLONE_FILES as u64),
            None
        );
        // personality: the same answers as the native program.
        for persona in [
            0,
            0xffff_ffff,
            1,
            0x0040000,
            0x7fff_ffff,
            0xffff_fffe,
            0x8000_0000,
            8,
        ] {
            let native = verdict(&Call::new(libc::SYS_personality, &[persona]));
            let denied = profile_denies(&p, "personality", persona).is_some();
            assert_eq!(denied, native != ALLOW, "{persona:#x}");
        }
        assert_eq!(profile_denies(&p, "getpid", 0), None);
    }

    #[test]
    fn the_list_names_what_the_threat_model_names() {
        let names: Vec<&str> = DENIED.iter().map(|(n, _)| *n).collect();
        for n in [
            "ptrace",
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "fsopen",
            "fsmount",
            "open_tree",
            "setns",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "userfaultfd",
            "process_vm_readv",
            "process_vm_writev",
            "open_by_handle_at",
            "name_to_handle_at",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "lookup_dcookie",
        ] {
            assert!(names.contains(&n), "{n} is not denied");
        }
        #[cfg(target_arch = "x86_64")]
        assert!(names.contains(&"iopl") && names.contains(&"ioperm"));
    }

    #[test]
    fn clone_and_unshare_may_not_make_namespaces_but_threads_and_forks_pass() {
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        assert_eq!(verdict(&Call::new(libc::SYS_clone, &[thread])), ALLOW);
        assert_eq!(verdict(&Call::new(libc::SYS_clone, &[fork])), ALLOW);
        for f in NAMESPACE_FLAGS {
            assert_eq!(
                verdict(&Call::new(libc::SYS_clone, &[fork | f])),
                EPERM,
                "clone {f:#x}"
            );
            assert_eq!(
                verdict(&Call::new(libc::SYS_unshare, &[*f])),
                EPERM,
                "unshare {f:#x}"
            );
        }
        let newtime = libc::CLONE_NEWTIME as u64;
        assert_eq!(verdict(&Call::new(libc::SYS_unshare, &[newtime])), EPERM);
        // Unsharing the file table or fs attributes is harmless.
        let harmless = (libc::CLONE_FILES | libc::CLONE_FS) as u64;
        assert_eq!(verdict(&Call::new(libc::SYS_unshare, &[harmless])), ALLOW);
        // clone3's flags cannot be read: ENOSYS, so libc falls back to clone.
        assert_eq!(verdict(&Call::new(libc::SYS_clone3, &[0, 88])), ENOSYS);
    }

    #[test]
    fn only_the_default_personality_is_allowed() {
        let p = libc::SYS_personality;
        assert_eq!(verdict(&Call::new(p, &[0])), ALLOW);
        assert_eq!(verdict(&Call::new(p, &[0xffff_ffff])), ALLOW);
        // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, PER_LINUX32.
        for v in [0x0040000, 0x0400000, 0x0008] {
            assert_eq!(verdict(&Call::new(p, &[v])), EPERM, "{v:#x}");
        }
    }

    #[test]
    fn a_foreign_architecture_is_killed_and_x32_gets_enosys() {
        let mut call = Call::new(libc::SYS_getpid, &[]);
        call.arch = 3 | 0x4000_0000; // AUDIT_ARCH_I386
        assert_eq!(verdict(&call), libc::SECCOMP_RET_KILL_PROCESS);
        // The program checks the architecture it was built for.
        let first = &eperm_program(ARCH).unwrap()[1];
        assert_eq!(first.k, audit_arch(ARCH));
        if ARCH == TargetArch::x86_64 {
            let x32_mount = i64::from(X32_SYSCALL_BIT) + libc::SYS_mount;
            assert_eq!(verdict(&Call::new(x32_mount, &[])), ENOSYS);
            assert_eq!(programs(ARCH).unwrap().len(), 5);
        }
        // Both architectures build.
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            let p = eperm_program(arch).unwrap();
            assert_eq!(p[1].k, audit_arch(arch));
        }
    }

    #[test]
    fn programs_are_written_as_the_kernel_reads_them() {
        let bytes = to_bytes(&x32_guard());
        assert_eq!(bytes.len(), 4 * 8);
        assert_eq!(&bytes[0..2], &0x20u16.to_ne_bytes());
        assert_eq!(&bytes[12..16], &X32_SYSCALL_BIT.to_ne_bytes());
        let fds = memfds().unwrap();
        assert_eq!(fds.len(), programs(ARCH).unwrap().len());
        let mut read = Vec::new();
        std::io::Read::read_to_end(
            &mut std::fs::File::from(fds.into_iter().next().unwrap()),
            &mut read,
        )
        .unwrap();
        assert_eq!(read, to_bytes(&eperm_program(ARCH).unwrap()));
    }

    const EAFNOSUPPORT: u32 = libc::SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32;
    const EPROTONOSUPPORT: u32 = libc::SECCOMP_RET_ERRNO | libc::EPROTONOSUPPORT as u32;

    /// Every family the kernel defines (linux/socket.h, `AF_MAX` 46 in 6.x)
    /// and values beyond it, with the type and protocol a caller would pass.
    fn families() -> impl Iterator<Item = u64> {
        (0..=70).chain([255, 256, 1 << 16, 0x7fff_ffff, 0xffff_ffff])
    }

    #[test]
    fn only_unix_inet_inet6_and_route_netlink_sockets_are_allowed() {
        let allowed: Vec<u64> = FAMILIES.iter().map(|(_, f)| *f).collect();
        assert_eq!(allowed, [1, 2, 10, 16]);
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            for f in families() {
                let stream = libc::SOCK_STREAM as u64;
                let want = if allowed.contains(&f) {
                    ALLOW
                } else {
                    EAFNOSUPPORT
                };
                assert_eq!(verdict(&Call::new(nr, &[f, stream, 0])), want, "{nr} {f}");
                // Bits above the int the kernel reads change nothing.
                let high = f | (7 << 32);
                assert_eq!(
                    verdict(&Call::new(nr, &[high, stream, 0])),
                    want,
                    "{nr} {high:#x}"
                );
            }
        }
        let vsock = libc::AF_VSOCK as u64;
        assert_eq!(
            verdict(&Call::new(libc::SYS_socket, &[vsock, 1, 0])),
            EAFNOSUPPORT
        );
        // Netlink: NETLINK_ROUTE only (the protocol's high bits ignored too).
        let nl = libc::AF_NETLINK as u64;
        let raw = libc::SOCK_RAW as u64;
        assert_eq!(verdict(&Call::new(libc::SYS_socket, &[nl, raw, 0])), ALLOW);
        assert_eq!(
            verdict(&Call::new(libc::SYS_socket, &[nl, raw, 1 << 32])),
            ALLOW
        );
        for proto in [4, 9, 15, 16, 31, 0xffff_ffff] {
            assert_eq!(
                verdict(&Call::new(libc::SYS_socket, &[nl, raw, proto])),
                EPROTONOSUPPORT,
                "netlink protocol {proto}"
            );
        }
        // An INET socket's protocol is the kernel's business.
        let inet = libc::AF_INET as u64;
        assert_eq!(verdict(&Call::new(libc::SYS_socket, &[inet, 2, 17])), ALLOW);
    }

    #[test]
    fn the_docker_profile_allows_the_same_families() {
        let p = docker_profile();
        let allowed: Vec<u64> = FAMILIES.iter().map(|(_, f)| *f).collect();
        for name in ["socket", "socketpair"] {
            for f in families() {
                let native = verdict(&Call::new(libc::SYS_socket, &[f, 1, 0]));
                let got = profile_denies_args(&p, name, &[f, 1, 0]);
                let want = (!allowed.contains(&f)).then_some(i64::from(libc::EAFNOSUPPORT));
                assert_eq!(got, want, "{name} {f}");
                assert_eq!(got.is_some(), native != ALLOW, "{name} {f}");
            }
        }
        let nl = libc::AF_NETLINK as u64;
        assert_eq!(profile_denies_args(&p, "socket", &[nl, 3, 0]), None);
        for proto in [4, 9, 16, 0xffff_ffff] {
            assert_eq!(
                profile_denies_args(&p, "socket", &[nl, 3, proto]),
                Some(i64::from(libc::EPROTONOSUPPORT)),
                "netlink protocol {proto}"
            );
        }
        // Another family's protocol number is not netlink's.
        assert_eq!(profile_denies_args(&p, "socket", &[2, 2, 17]), None);
    }
}
