//! Host-name egress rules for real (issue 15): a sandbox allowed `allowed.test` and `*.wild.test`
//! over a deny-everything reaches exactly those names through the host's egress proxy, by HTTP `Host`
//! and by TLS SNI, whatever address it aims at; every trick that would let the guest choose where a
//! connection goes is tried and fails. The "internet" is a network namespace the test makes: two
//! addresses on a test-owned /29 in 198.18.0.0/15, an HTTP and a TLS-shaped listener on each, a third
//! address with a real HTTPS server (a CA of the test's own) for the header rules, and a dnsmasq of
//! the test's own answering the names. No packet leaves the machine.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_runtime::network::egress::{Cidr, EgressRules, HeaderRule};
use warren_runtime::network::requested_name::{self, Requested};
use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, NetworkSpec, Runtime, Sandbox};

fn host(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().expect(program);
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a listener of the test's internet saw: which of its addresses and ports, and the name the
/// connection asked for (HTTP Host or TLS SNI), or the first bytes when it named none.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    at: SocketAddr,
    asked: String,
}

/// The test's internet: namespace `name` with addresses `a` and `b`, joined to the test's own
/// namespace by a veth on a /29 (no default route anywhere).
struct Internet {
    name: String,
    a: Ipv4Addr,
    b: Ipv4Addr,
    /// api.allowed.test: a real HTTPS server (certificate from the test's own CA) and HTTP.
    c: Ipv4Addr,
    seen: Arc<Mutex<Vec<Seen>>>,
    dns: Option<Child>,
}

impl Internet {
    fn plan() -> (Ipv4Addr, Ipv4Addr, Ipv4Addr, Ipv4Addr) {
        let third = (std::process::id() % 250) as u8;
        (
            Ipv4Addr::new(198, 18, third, 1),
            Ipv4Addr::new(198, 18, third, 2),
            Ipv4Addr::new(198, 18, third, 3),
            Ipv4Addr::new(198, 18, third, 4),
        )
    }

    fn create(tls: Arc<rustls::ServerConfig>) -> Internet {
        let (local, a, b, c) = Internet::plan();
        let name = format!("wt-inet-{}", std::process::id());
        let link = format!("wti{}", std::process::id() % 100_000);
        host("ip", &["netns", "add", &name]);
        let mut internet = Internet {
            name: name.clone(),
            a,
            b,
            c,
            seen: Arc::new(Mutex::new(Vec::new())),
            dns: None,
        };
        host(
            "ip",
            &[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
        );
        host("ip", &["addr", "add", &format!("{local}/29"), "dev", &link]);
        host("ip", &["link", "set", &link, "up"]);
        for ip in [a, b, c] {
            host(
                "ip",
                &[
                    "-n",
                    &name,
                    "addr",
                    "add",
                    &format!("{ip}/29"),
                    "dev",
                    "eth0",
                ],
            );
        }
        host("ip", &["-n", &name, "link", "set", "eth0", "up"]);
        host("ip", &["-n", &name, "link", "set", "lo", "up"]);
        for ip in [a, b] {
            for port in [80, 443, 8080] {
                internet.listen(ip, port, None);
            }
        }
        internet.listen(c, 80, None);
        internet.listen(c, 443, Some(tls));
        internet.start_dns();
        internet
    }

    fn listen(&self, ip: Ipv4Addr, port: u16, tls: Option<Arc<rustls::ServerConfig>>) {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        let listener = warren_runtime::namespaces::run_in(
            &ns,
            nix::sched::CloneFlags::CLONE_NEWNET,
            move || TcpListener::bind((ip, port)),
        )
        .expect("join the internet namespace")
        .expect("bind in the internet namespace");
        let seen = Arc::clone(&self.seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let seen = Arc::clone(&seen);
                let tls = tls.clone();
                std::thread::spawn(move || match tls {
                    None => serve(&mut stream, ip, port, &seen),
                    Some(config) => {
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                        let Ok(connection) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        let mut tls = rustls::StreamOwned::new(connection, stream);
                        serve(&mut tls, ip, port, &seen);
                    }
                });
            }
        });
    }

    /// dnsmasq answering allowed.test and *.wild.test with `a`, other.test with `b`.
    fn start_dns(&mut self) {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "dnsmasq",
                "--keep-in-foreground",
            ])
            .args([
                "--no-resolv",
                "--no-hosts",
                "--conf-file=/dev/null",
                "--user=root",
            ])
            .args(["--bind-interfaces", "--port=53", "--pid-file="])
            .arg(format!("--listen-address={}", self.a))
            .arg(format!("--address=/allowed.test/{}", self.a))
            .arg(format!("--address=/wild.test/{}", self.a))
            .arg(format!("--address=/other.test/{}", self.b))
            .arg(format!("--address=/api.allowed.test/{}", self.c))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dnsmasq (Debian package dnsmasq-base)");
        self.dns = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(&(self.a, 53).into(), Duration::from_millis(200))
            .is_err()
        {
            assert!(Instant::now() < deadline, "dnsmasq never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        if let Some(mut dns) = self.dns.take() {
            let _ = dns.kill();
            let _ = dns.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

/// Records what the connection asked for; answers HTTP with `served-by <ip>`, anything else with a
/// line that is not TLS (the test only needs to see the ClientHello arrive).
fn serve(stream: &mut (impl Read + Write), ip: Ipv4Addr, port: u16, seen: &Mutex<Vec<Seen>>) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    let asked = loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break String::from_utf8_lossy(&head).into_owned(),
            Ok(n) => n,
        };
        head.extend_from_slice(&chunk[..n]);
        let found = if head[0] == 0x16 {
            requested_name::tls_server_name(&head)
        } else {
            requested_name::http_host(&head)
        };
        match found {
            Requested::Name(name) => break name,
            Requested::Refused(_) => break String::from_utf8_lossy(&head).into_owned(),
            Requested::Incomplete => {}
        }
    };
    seen.lock().unwrap().push(Seen {
        at: SocketAddr::from((ip, port)),
        asked,
    });
    // The request's Authorization header, if any, is echoed: where header rules are checked.
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let auth = match request.parse(&head) {
        Ok(_) => request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("authorization"))
            .map(|h| format!(" auth={}", String::from_utf8_lossy(h.value))),
        Err(_) => None,
    };
    let body = format!("served-by {ip}{}", auth.unwrap_or_default());
    let reply = if head.first() == Some(&0x16) {
        format!("{body}\n")
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let _ = stream.write_all(reply.as_bytes());
}

fn exec(sandbox: &Sandbox, command: &str) -> String {
    common::exec(sandbox, command).0
}

/// `curl` of `http://<ip>:<port>/` naming `name` in `Host`; its output (body or error).
fn http(sandbox: &Sandbox, ip: Ipv4Addr, port: u16, name: &str) -> String {
    exec(
        sandbox,
        &format!("curl -s -S -m 5 -H 'Host: {name}' http://{ip}:{port}/ 2>&1"),
    )
}

/// A TLS handshake to `ip:443` with SNI `name` (the listener answers no TLS, so it fails; what
/// counts is where the ClientHello arrives).
fn tls(sandbox: &Sandbox, ip: Ipv4Addr, name: &str) {
    exec(
        sandbox,
        &format!("curl -s -k -m 5 --resolve {name}:443:{ip} https://{name}/ >/dev/null 2>&1; true"),
    );
}

fn rules(allow: &[&str], deny: &[&str]) -> EgressRules {
    let (cidrs, hosts) = EgressRules::parse_allow(
        "network.allowOut",
        &allow.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
    .expect("allow list");
    EgressRules {
        allow: cidrs,
        allow_hosts: hosts,
        deny: deny.iter().map(|d| d.parse::<Cidr>().unwrap()).collect(),
        header_rules: vec![],
        upstream: None,
    }
}

#[test]
fn host_name_rules_reach_only_the_allowed_names_whatever_the_guest_claims() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    // The runtime first, then the internet: the runtime's always-denied list is the host's networks
    // at its start, and the test's /29 must not be among them.
    let (_, dns_ip, _, _) = Internet::plan();
    let (upstream_ca, api_tls) = test_pki("api.allowed.test");
    let state_dir = common::state_dir("egress-names");
    std::fs::create_dir_all(&state_dir).unwrap();
    let upstream_ca_file = state_dir.join("test-upstream-ca.pem");
    std::fs::write(&upstream_ca_file, upstream_ca).unwrap();
    let runtime = LinuxRuntime::new(LinuxRuntimeConfig {
        state_dir,
        agent_binary: common::test_agent(),
        supervisor_binary: Some(env!("CARGO_BIN_EXE_warren-supervisor").into()),
        egress_resolvers: vec![SocketAddr::from((dns_ip, 53))],
        egress_upstream_ca: vec![upstream_ca_file],
        ..LinuxRuntimeConfig::default()
    })
    .expect("runtime");
    let internet = Internet::create(api_tls);
    let (a, b, c) = (internet.a, internet.b, internet.c);

    let mut spec = common::spec("wt-names", vec![base], common::resources());
    spec.network = NetworkSpec {
        allow_internet: true,
        raw_sockets: false,
        egress: rules(&["allowed.test", "*.wild.test"], &["0.0.0.0/0"]),
    };
    let sandbox = runtime.create(&spec).expect("create sandbox");
    struct Destroy<'a>(&'a LinuxRuntime, &'a str);
    impl Drop for Destroy<'_> {
        fn drop(&mut self) {
            let _ = self.0.destroy(self.1);
            // The state dir's lxcfs daemon outlives its sandboxes; end it with the test.
            warren_runtime::rootfs::lxcfs::stop(&self.0.config().state_dir);
            let _ = std::fs::remove_dir_all(&self.0.config().state_dir);
        }
    }
    let _destroy = Destroy(&runtime, &sandbox.id);

    // An allowed name reaches its own address even when the guest aims at the neighbour's.
    let out = http(&sandbox, b, 80, "allowed.test");
    assert_eq!(out, format!("served-by {a}"), "{out}");
    let out = http(&sandbox, a, 80, "api.wild.test");
    assert_eq!(out, format!("served-by {a}"), "{out}");
    // Names not allowed, the wildcard's own apex included, get the proxy's 403 and reach nobody.
    for name in ["other.test", "wild.test", "allowed.test.other.test"] {
        let out = http(&sandbox, b, 80, name);
        assert!(out.contains("not allowed"), "{name}: {out}");
    }
    // TLS: the ClientHello goes where the SNI's name resolves, not where the guest connected; a
    // forbidden SNI reaches nobody.
    tls(&sandbox, b, "allowed.test");
    tls(&sandbox, b, "other.test");
    tls(&sandbox, a, "other.test");
    // Other ports are address rules only: denied.
    let out = http(&sandbox, b, 8080, "allowed.test");
    assert!(!out.contains("served-by"), "port 8080 got through: {out}");
    // The proxy itself cannot be reached except through a redirect.
    let out = exec(
        &sandbox,
        "curl -s -S -m 3 -H 'Host: allowed.test' http://10.77.0.1:49090/ 2>&1; echo rc=$?",
    );
    assert!(!out.contains("served-by"), "the proxy port was open: {out}");
    let seen = internet.seen();
    let expected = vec![
        Seen {
            at: SocketAddr::from((a, 80)),
            asked: "allowed.test".into(),
        },
        Seen {
            at: SocketAddr::from((a, 80)),
            asked: "api.wild.test".into(),
        },
        Seen {
            at: SocketAddr::from((a, 443)),
            asked: "allowed.test".into(),
        },
    ];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = seen;
    while seen.len() < expected.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen = internet.seen();
    }
    assert_eq!(seen, expected, "what the internet saw");

    // Replacing the rules applies at once: the other name now, and the first one no more.
    internet.clear();
    let mut network = spec.network.clone();
    network.egress = rules(&["other.test"], &["0.0.0.0/0"]);
    runtime.set_network(&sandbox.id, &network).expect("update");
    let out = http(&sandbox, a, 80, "other.test");
    assert_eq!(out, format!("served-by {b}"), "{out}");
    let out = http(&sandbox, b, 80, "allowed.test");
    assert!(out.contains("not allowed"), "{out}");
    assert_eq!(
        internet.seen(),
        vec![Seen {
            at: SocketAddr::from((b, 80)),
            asked: "other.test".into()
        }]
    );

    // Without names the redirections go (the sandbox's elements in set names_deny); destroy
    // removes what is left.
    let redirected = format!("{} . 0.0.0.0/0", sandbox.ip);
    let names_deny = || host("nft", &["list", "set", "ip", "warren", "names_deny"]);
    assert!(names_deny().contains(&redirected), "{}", names_deny());
    network.egress = rules(&[], &["0.0.0.0/0"]);
    runtime.set_network(&sandbox.id, &network).expect("update");
    assert!(!names_deny().contains(&redirected), "{}", names_deny());
    let out = http(&sandbox, b, 80, "other.test");
    assert!(!out.contains("served-by"), "{out}");

    // Header rules: the secret is set by the proxy on requests to api.allowed.test (over HTTPS with
    // the host's egress CA, which the sandbox trusts, and over HTTP), replacing what the sandbox
    // sent, and is nowhere inside the sandbox.
    let secret = "Bearer s3cret-from-the-host";
    network.egress = EgressRules {
        header_rules: vec![HeaderRule {
            pattern: "api.allowed.test".parse().unwrap(),
            headers: vec![("Authorization".into(), secret.into())],
        }],
        ..rules(&["api.allowed.test"], &["0.0.0.0/0"])
    };
    runtime.set_network(&sandbox.id, &network).expect("update");
    let ca = runtime
        .egress_trust_anchor(&sandbox.id)
        .expect("the runtime has an egress CA");
    // The test agent takes one line: the PEM goes in as hex.
    let hex: String = ca.bytes().map(|byte| format!("{byte:02x}")).collect();
    exec(
        &sandbox,
        &format!("python3 -c \"open('/tmp/egress-ca.pem', 'wb').write(bytes.fromhex('{hex}'))\""),
    );
    let https = |host_header: &str| {
        exec(
            &sandbox,
            &format!(
                "curl -s -S -m 5 --cacert /tmp/egress-ca.pem --resolve api.allowed.test:443:{b} \
                 -H 'Authorization: from-the-sandbox' -H 'Host: {host_header}' \
                 -w ' status=%{{http_code}}' https://api.allowed.test/ 2>&1"
            ),
        )
    };
    let out = https("api.allowed.test");
    assert_eq!(
        out,
        format!("served-by {c} auth={secret} status=200"),
        "{out}"
    );
    // A request on that connection for another host is refused, so the secret never goes with it.
    let out = https("other.test");
    assert!(out.ends_with("status=421"), "{out}");
    let out = exec(
        &sandbox,
        &format!(
            "curl -s -S -m 5 -H 'Host: api.allowed.test' -H 'Authorization: x' http://{b}/ 2>&1"
        ),
    );
    assert_eq!(out, format!("served-by {c} auth={secret}"), "{out}");
    // Names without rules are relayed untouched (and still by the address rules: denied here).
    let out = http(&sandbox, a, 80, "allowed.test");
    assert!(out.contains("not allowed"), "{out}");
    let (found, code) = common::exec(
        &sandbox,
        "grep -rsl s3cret-from-the-host /etc /tmp /root /home /proc/self/environ /proc/1/environ",
    );
    assert_ne!(code, 0, "the secret is inside the sandbox: {found}");
}

/// A CA of the test's own and TLS settings for `name` signed by it: (CA PEM, server settings).
fn test_pki(name: &str) -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "warren test upstream CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}
