//! A sandbox's own SOCKS5 proxy (`network.egressProxy`, issue 15) for real: the test's "internet" is a
//! network namespace with a web server, Debian's `microsocks` (plain, and with a login) and a TLS front
//! for it (`socat`, with a certificate from the test's own CA), and a dnsmasq of the test's own. The web
//! server records who connected: the SOCKS5 server's address when a connection was tunneled, the
//! host's side of the test link when it went out directly. Addresses are test-owned (198.18.x.16/28,
//! and a private 10.99.x.1 that exists only inside the test's namespace); no packet leaves the machine.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_runtime::network::egress::{Cidr, EgressRules, UpstreamProxy, UpstreamTls};
use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, NetworkSpec, Runtime, RuntimeError};

fn host(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().expect(program);
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One request the web server saw: where it arrived, from whom, for which `Host`.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    at: SocketAddr,
    from: Ipv4Addr,
    host: String,
}

struct Internet {
    name: String,
    /// The host's end of the test link.
    local: Ipv4Addr,
    web: Ipv4Addr,
    socks: Ipv4Addr,
    /// A private address inside the namespace: always denied to sandboxes.
    private: Ipv4Addr,
    seen: Arc<Mutex<Vec<Seen>>>,
    children: Vec<Child>,
}

impl Internet {
    fn plan() -> (Ipv4Addr, Ipv4Addr, Ipv4Addr, Ipv4Addr) {
        let third = (std::process::id() % 250) as u8;
        (
            Ipv4Addr::new(198, 18, third, 17),
            Ipv4Addr::new(198, 18, third, 18),
            Ipv4Addr::new(198, 18, third, 19),
            Ipv4Addr::new(10, 99, third, 1),
        )
    }

    fn create(socks_ca: &TestCa) -> Internet {
        let (local, web, socks, private) = Internet::plan();
        let name = format!("wt-socks-{}", std::process::id());
        let link = format!("wts{}", std::process::id() % 100_000);
        host("ip", &["netns", "add", &name]);
        let mut internet = Internet {
            name: name.clone(),
            local,
            web,
            socks,
            private,
            seen: Arc::new(Mutex::new(Vec::new())),
            children: Vec::new(),
        };
        host(
            "ip",
            &[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
        );
        host("ip", &["addr", "add", &format!("{local}/28"), "dev", &link]);
        host("ip", &["link", "set", &link, "up"]);
        for ip in [web, socks] {
            host(
                "ip",
                &[
                    "-n",
                    &name,
                    "addr",
                    "add",
                    &format!("{ip}/28"),
                    "dev",
                    "eth0",
                ],
            );
        }
        host(
            "ip",
            &[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{private}/32"),
                "dev",
                "lo",
            ],
        );
        host("ip", &["-n", &name, "link", "set", "eth0", "up"]);
        host("ip", &["-n", &name, "link", "set", "lo", "up"]);
        for (ip, port) in [(web, 80), (web, 8080), (private, 80)] {
            internet.listen(ip, port);
        }
        // The namespace's resolver, for the SOCKS5 server's own lookups of names it is asked for.
        let etc = format!("/etc/netns/{name}");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(format!("{etc}/resolv.conf"), format!("nameserver {web}\n")).unwrap();
        let dns = internet.spawn(&[
            "dnsmasq",
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--conf-file=/dev/null",
            "--user=root",
            "--bind-interfaces",
            "--port=53",
            "--pid-file=",
            &format!("--listen-address={web}"),
            &format!("--address=/web.test/{web}"),
            &format!("--address=/socks.test/{socks}"),
            &format!("--address=/inside.test/{private}"),
        ]);
        internet.children.push(dns);
        // Outgoing connections leave from `socks`, so the web server can tell a tunneled one.
        let plain = internet.spawn(&[
            "microsocks",
            "-i",
            &socks.to_string(),
            "-p",
            "1080",
            "-b",
            &socks.to_string(),
        ]);
        internet.children.push(plain);
        let login = internet.spawn(&[
            "microsocks",
            "-i",
            &socks.to_string(),
            "-p",
            "1081",
            "-b",
            &socks.to_string(),
            "-u",
            "agent",
            "-P",
            "right-pass",
        ]);
        internet.children.push(login);
        let cert = format!("{etc}/socks.pem");
        std::fs::write(&cert, socks_ca.leaf_pem("socks.test")).unwrap();
        let front = internet.spawn(&[
            "socat",
            &format!("OPENSSL-LISTEN:1443,bind={socks},reuseaddr,fork,cert={cert},verify=0"),
            &format!("TCP:{socks}:1080"),
        ]);
        internet.children.push(front);
        for (ip, port) in [(web, 53), (socks, 1080), (socks, 1081), (socks, 1443)] {
            internet.wait_for(ip, port);
        }
        internet
    }

    fn spawn(&self, argv: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {} (Debian package): {e}", argv[0]))
    }

    fn wait_for(&self, ip: Ipv4Addr, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(200))
            .is_err()
        {
            assert!(Instant::now() < deadline, "nothing listens on {ip}:{port}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn listen(&self, ip: Ipv4Addr, port: u16) {
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
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 2048];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let host_header = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Host: ").or(l.strip_prefix("host: ")))
                        .unwrap_or("")
                        .to_string();
                    let from = match stream.peer_addr() {
                        Ok(SocketAddr::V4(peer)) => *peer.ip(),
                        _ => Ipv4Addr::UNSPECIFIED,
                    };
                    seen.lock().unwrap().push(Seen {
                        at: SocketAddr::from((ip, port)),
                        from,
                        host: host_header,
                    });
                    let body = format!("served-by {ip} to {from}");
                    let _ = stream.write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    );
                });
            }
        });
    }

    fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

/// A CA of the test's own.
struct TestCa {
    key: rcgen::KeyPair,
    cert: rcgen::Certificate,
}

impl TestCa {
    fn new() -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "warren test SOCKS CA");
        let cert = params.self_signed(&key).unwrap();
        TestCa { key, cert }
    }

    /// Certificate and key (one PEM file, as socat takes it) for `name`.
    fn leaf_pem(&self, name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        format!("{}{}", leaf.pem(), key.serialize_pem())
    }
}

fn proxy(host: &str, port: u16) -> UpstreamProxy {
    UpstreamProxy {
        host: host.into(),
        port,
        username: None,
        password: None,
        tls: None,
    }
}

fn network(upstream: UpstreamProxy, allow: &[&str], deny: &[&str]) -> NetworkSpec {
    let (cidrs, hosts) = EgressRules::parse_allow(
        "network.allowOut",
        &allow.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    )
    .unwrap();
    NetworkSpec {
        allow_internet: true,
        raw_sockets: false,
        egress: EgressRules {
            allow: cidrs,
            allow_hosts: hosts,
            deny: deny.iter().map(|d| d.parse::<Cidr>().unwrap()).collect(),
            header_rules: vec![],
            upstream: Some(upstream),
        },
    }
}

#[test]
fn a_sandbox_s_tcp_goes_through_its_socks5_proxy_and_nowhere_else() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let (_, dns_ip, _, _) = Internet::plan();
    let state_dir = common::state_dir("egress-upstream");
    std::fs::create_dir_all(&state_dir).unwrap();
    // The runtime first: its always-denied list is the host's networks at its start, and the test's
    // link must not be among them.
    let runtime = LinuxRuntime::new(LinuxRuntimeConfig {
        state_dir,
        agent_binary: common::test_agent(),
        supervisor_binary: Some(env!("CARGO_BIN_EXE_warren-supervisor").into()),
        egress_resolvers: vec![SocketAddr::from((dns_ip, 53))],
        ..LinuxRuntimeConfig::default()
    })
    .expect("runtime");
    let ca = TestCa::new();
    let internet = Internet::create(&ca);
    let (web, socks, private) = (internet.web, internet.socks, internet.private);

    // Checked before use: an address sandboxes may never reach, a name that does not resolve.
    for (bad, needle) in [
        (proxy("10.77.255.250", 1080), "may never reach"),
        (proxy("inside.test", 1080), "may never reach"),
        (proxy("nowhere.test", 1080), "did not resolve"),
    ] {
        match runtime.check_network(&network(bad.clone(), &[], &[])) {
            Err(RuntimeError::InvalidSpec(message)) => {
                assert!(message.contains(needle), "{bad:?}: {message}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    runtime
        .check_network(&network(proxy("socks.test", 1080), &[], &[]))
        .expect("a proxy by name");

    let mut spec = common::spec("wt-socks", vec![base], common::resources());
    spec.network = network(proxy(&socks.to_string(), 1080), &[], &[]);
    let sandbox = runtime.create(&spec).expect("create sandbox");
    struct Destroy<'a>(&'a LinuxRuntime, &'a str);
    impl Drop for Destroy<'_> {
        fn drop(&mut self) {
            let _ = self.0.destroy(self.1);
            warren_runtime::rootfs::lxcfs::stop(&self.0.config().state_dir);
            let _ = std::fs::remove_dir_all(&self.0.config().state_dir);
        }
    }
    let _destroy = Destroy(&runtime, &sandbox.id);
    let curl = |args: &str| {
        common::exec(
            &sandbox,
            &format!("curl -s -S -m 5 {args} 2>&1; echo \" rc=$?\""),
        )
        .0
    };

    // Any port, tunneled: the web server sees the SOCKS5 server, not the host.
    for port in [8080, 80] {
        let out = curl(&format!("http://{web}:{port}/"));
        assert!(
            out.starts_with(&format!("served-by {web} to {socks}")),
            "{out}"
        );
    }
    assert_eq!(internet.take_seen().len(), 2);
    // The always-denied ranges stay denied through the tunnel (a private address that exists only
    // inside the test's namespace, where the SOCKS5 server could reach it).
    let out = curl(&format!("http://{private}/"));
    assert!(!out.contains("served-by"), "{out}");
    assert_eq!(internet.take_seen(), vec![]);

    // Rules are applied before tunneling; a name allowed over a deny-all is handed to the proxy by
    // name, whatever address the guest aimed at.
    runtime
        .set_network(
            &sandbox.id,
            &network(
                proxy(&socks.to_string(), 1080),
                &["web.test"],
                &["0.0.0.0/0"],
            ),
        )
        .unwrap();
    let out = curl(&format!("-H 'Host: web.test' http://{private}/"));
    assert!(
        out.starts_with(&format!("served-by {web} to {socks}")),
        "{out}"
    );
    let out = curl(&format!("http://{web}:8080/"));
    assert!(!out.contains("served-by"), "denied port got through: {out}");
    assert_eq!(
        internet.take_seen(),
        vec![Seen {
            at: SocketAddr::from((web, 80)),
            from: socks,
            host: "web.test".into()
        }]
    );

    // Fails closed: a proxy that does not answer, a wrong login, and a TLS proxy whose certificate
    // the host does not trust each leave the connection refused, never sent directly.
    let login = |password: &str| UpstreamProxy {
        username: Some("agent".into()),
        password: Some(password.into()),
        ..proxy(&socks.to_string(), 1081)
    };
    let tls = |ca_cert: Option<String>| UpstreamProxy {
        tls: Some(UpstreamTls {
            server_name: None,
            ca_cert,
        }),
        ..proxy("socks.test", 1443)
    };
    for broken in [
        proxy(&socks.to_string(), 1099),
        login("wrong-pass"),
        proxy(&socks.to_string(), 1081),
        tls(None),
    ] {
        runtime
            .set_network(&sandbox.id, &network(broken.clone(), &[], &[]))
            .unwrap();
        let out = curl(&format!("http://{web}:8080/"));
        assert!(!out.contains("served-by"), "{broken:?}: {out}");
    }
    assert_eq!(internet.take_seen(), vec![], "something went out directly");

    // The right login, and TLS verified against the CA given.
    for working in [login("right-pass"), tls(Some(ca.cert.pem()))] {
        runtime
            .set_network(&sandbox.id, &network(working.clone(), &[], &[]))
            .unwrap();
        let out = curl(&format!("http://{web}:8080/"));
        assert!(
            out.starts_with(&format!("served-by {web} to {socks}")),
            "{working:?}: {out}"
        );
    }

    // Without a proxy the sandbox goes out directly again (the host's side of the link).
    internet.take_seen();
    runtime
        .set_network(
            &sandbox.id,
            &NetworkSpec {
                allow_internet: true,
                raw_sockets: false,
                egress: EgressRules::default(),
            },
        )
        .unwrap();
    let out = curl(&format!("http://{web}:8080/"));
    assert!(
        out.starts_with(&format!("served-by {web} to {}", internet.local)),
        "{out}"
    );
    let chain = format!("en-{}-{}", sandbox.ip.octets()[2], sandbox.ip.octets()[3]);
    assert!(!host("nft", &["list", "table", "ip", "warren"]).contains(&chain));
}
