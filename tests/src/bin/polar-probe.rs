//! A small network client the end-to-end tests run inside sandboxes: it
//! dials addresses, resolves names, sends DNS and UDP packets, and prints one
//! JSON line per action with what the kernel reported, so tests can compare
//! what the sandboxed program saw with what the agent captured.
//!
//! Usage: `polar-probe connect ADDR...` | `polar-probe loop ADDR COUNT` |
//! `polar-probe resolve NAME` | `polar-probe dns SERVER NAME` |
//! `polar-probe udp ADDR` | `polar-probe selfserve` | `polar-probe hold ADDR
//! COUNT` (half-open connections held until stdin closes) | `polar-probe
//! hold-tls ADDR COUNT SNI CA_PEM` (idle TLS connections, likewise) |
//! `polar-probe started FILE` (writes the wall-clock time it started, in
//! nanoseconds since the epoch, first thing: the sandbox start benchmark).
#![deny(unsafe_op_in_unsafe_fn)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

#[expect(clippy::print_stdout, reason = "the probe reports on stdout")]
fn emit(v: serde_json::Value) {
    println!("{v}");
}

fn connect(addr: SocketAddr) -> serde_json::Value {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(mut s) => {
            let peer = s.peer_addr().map(|p| p.to_string()).unwrap_or_default();
            let payload = format!("probe {addr}");
            let sent = s.write_all(payload.as_bytes()).is_ok();
            json!({"op": "connect", "target": addr.to_string(), "ok": true, "peer": peer, "sent": payload, "sent_ok": sent})
        }
        Err(e) => {
            json!({"op": "connect", "target": addr.to_string(), "ok": false, "error": e.to_string()})
        }
    }
}

/// Connects `count` times; each time sends one byte and waits for the other
/// side to close first, so no TIME_WAIT is left on the client side.
fn connect_loop(addr: SocketAddr, count: u64) -> serde_json::Value {
    let mut ok = 0u64;
    let mut failed = 0u64;
    let mut last_error = String::new();
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut b = [0u8; 16];
                if s.write_all(b"x").is_ok() && matches!(s.read(&mut b), Ok(0)) {
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            Err(e) => {
                failed += 1;
                last_error = e.to_string();
            }
        }
    }
    json!({"op": "loop", "target": addr.to_string(), "ok": ok, "failed": failed, "last_error": last_error})
}

fn resolve(name: &str) -> serde_json::Value {
    match (name, 443).to_socket_addrs() {
        Ok(a) => json!({"op": "resolve", "name": name, "ok": true,
            "addrs": a.map(|x| x.ip().to_string()).collect::<Vec<_>>()}),
        Err(e) => json!({"op": "resolve", "name": name, "ok": false, "error": e.to_string()}),
    }
}

fn dns_query(name: &str) -> Vec<u8> {
    let mut m = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.extend_from_slice(&[0, 0, 1, 0, 1]);
    m
}

/// An unconnected UDP DNS exchange with `server` (sendto/recvfrom).
fn dns(server: SocketAddr, name: &str) -> serde_json::Value {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .unwrap_or(server);
    let result = (|| -> std::io::Result<serde_json::Value> {
        let s = UdpSocket::bind(bind)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.send_to(&dns_query(name), server)?;
        let mut buf = [0u8; 512];
        let (n, from) = s.recv_from(&mut buf)?;
        let answer = &buf[..n];
        let ancount = u16::from_be_bytes([answer[6], answer[7]]);
        let rcode = answer[3] & 0xf;
        let last4 = if n >= 4 {
            answer[n - 4..]
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(".")
        } else {
            String::new()
        };
        Ok(
            json!({"op": "dns", "server": server.to_string(), "ok": true, "from": from.to_string(),
            "rcode": rcode, "answers": ancount, "last_a": last4}),
        )
    })();
    result.unwrap_or_else(
        |e| json!({"op": "dns", "server": server.to_string(), "ok": false, "error": e.to_string()}),
    )
}

fn udp(addr: SocketAddr) -> serde_json::Value {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .unwrap_or(addr);
    let r = UdpSocket::bind(bind).and_then(|s| s.send_to(b"quic?", addr));
    match r {
        Ok(_) => json!({"op": "udp", "target": addr.to_string(), "ok": true}),
        Err(e) => json!({"op": "udp", "target": addr.to_string(), "ok": false,
            "error": e.to_string(), "errno": e.raw_os_error()}),
    }
}

/// A server the sandboxed program starts itself on loopback must stay
/// reachable inside an isolated sandbox.
fn selfserve() -> serde_json::Value {
    let result = (|| -> std::io::Result<serde_json::Value> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let mut c = TcpStream::connect(addr)?;
        c.write_all(b"self")?;
        let (mut s, _) = l.accept()?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)?;
        Ok(json!({"op": "selfserve", "ok": &b == b"self", "addr": addr.to_string()}))
    })();
    result.unwrap_or_else(|e| json!({"op": "selfserve", "ok": false, "error": e.to_string()}))
}

/// Opens `count` connections that send nothing, reports, and holds them
/// until stdin closes.
fn hold(addr: SocketAddr, count: usize) -> serde_json::Value {
    raise_fd_limit();
    let mut held = Vec::with_capacity(count);
    let mut failed = 0usize;
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => held.push(s),
            Err(_) => failed += 1,
        }
    }
    emit(json!({"op": "hold", "target": addr.to_string(), "held": held.len(), "failed": failed}));
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    json!({"op": "released", "count": held.len()})
}

/// Opens `count` TLS connections to `addr` with server name `sni`, trusting
/// the PEM file `ca`, completes each handshake, reports, and holds them until
/// stdin closes (idle, established connections).
fn hold_tls(
    addr: SocketAddr,
    count: usize,
    sni: &str,
    ca: &str,
) -> Result<serde_json::Value, String> {
    raise_fd_limit();
    let pem = std::fs::read(ca).map_err(|e| format!("{ca}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(
            &pem,
        )
    {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let name =
        rustls::pki_types::ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let tcp =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        let conn = rustls::ClientConnection::new(config.clone(), name.clone())
            .map_err(|e| e.to_string())?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .map_err(|e| e.to_string())?;
        }
        held.push(tls);
    }
    emit(json!({"op": "hold-tls", "held": held.len()}));
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(json!({"op": "released", "count": held.len()}))
}

/// Raises the soft open-file limit to the hard one.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn parse(a: &str) -> Result<SocketAddr, String> {
    a.parse().map_err(|e| format!("bad address {a}: {e}"))
}

fn main() -> ExitCode {
    // First thing, before anything else is done: when did we start?
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = || -> Result<(), String> {
        match args.first().map(String::as_str) {
            Some("connect") => {
                for a in &args[1..] {
                    emit(connect(parse(a)?));
                }
            }
            Some("loop") => {
                let addr = parse(args.get(1).ok_or("loop ADDR COUNT")?)?;
                let n = args
                    .get(2)
                    .and_then(|c| c.parse().ok())
                    .ok_or("loop ADDR COUNT")?;
                emit(connect_loop(addr, n));
            }
            Some("resolve") => emit(resolve(args.get(1).ok_or("resolve NAME")?)),
            Some("dns") => {
                let server = parse(args.get(1).ok_or("dns SERVER NAME")?)?;
                emit(dns(server, args.get(2).ok_or("dns SERVER NAME")?));
            }
            Some("udp") => emit(udp(parse(args.get(1).ok_or("udp ADDR")?)?)),
            Some("selfserve") => emit(selfserve()),
            Some("started") => {
                let file = args.get(1).ok_or("started FILE")?;
                std::fs::write(file, now.to_string()).map_err(|e| format!("{file}: {e}"))?;
            }
            Some("hold-tls") => {
                let usage = "hold-tls ADDR COUNT SNI CA_PEM";
                let addr = parse(args.get(1).ok_or(usage)?)?;
                let n = args.get(2).and_then(|c| c.parse().ok()).ok_or(usage)?;
                let sni = args.get(3).ok_or(usage)?;
                let ca = args.get(4).ok_or(usage)?;
                emit(hold_tls(addr, n, sni, ca)?);
            }
            Some("hold") => {
                let addr = parse(args.get(1).ok_or("hold ADDR COUNT")?)?;
                let n = args
                    .get(2)
                    .and_then(|c| c.parse().ok())
                    .ok_or("hold ADDR COUNT")?;
                emit(hold(addr, n));
            }
            _ => {
                return Err("usage: polar-probe connect|loop|resolve|dns|udp|selfserve ...".into());
            }
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polar-probe: {e}");
            ExitCode::from(2)
        }
    }
}
