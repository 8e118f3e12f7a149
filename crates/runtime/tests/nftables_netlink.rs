//! The netlink set-element batches of `network::nftables` against the real kernel, in a network
//! namespace of the test's own (a thread that unshared one; `nft`, started from it, sees the same
//! tables): what a batch adds, `nft list` shows and a listing reads back; what it deletes is gone; a
//! batch with one bad change applies nothing and its error names the element.

use std::process::{Command, Stdio};

use warren_runtime::network::nftables::{self, Batch, Element, Family, NftError, SetRef};

const RULESET: &str = "table ip wt {
    set internet { type ipv4_addr; }
    set pairs { type ipv4_addr . ipv4_addr; flags interval; }
}
table bridge wt {
    set ports { type ifname . ether_addr . ipv4_addr; }
}
";

const INTERNET: SetRef<'static> = SetRef {
    family: Family::Ip,
    table: "wt",
    set: "internet",
};
const PAIRS: SetRef<'static> = SetRef {
    family: Family::Ip,
    table: "wt",
    set: "pairs",
};
const PORTS: SetRef<'static> = SetRef {
    family: Family::Bridge,
    table: "wt",
    set: "ports",
};

fn nft(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nft");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("nft's stdin")
            .write_all(text.as_bytes())
            .expect("write the ruleset");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait for nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn skip_reason() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, nftables)");
    }
    if Command::new("nft").arg("--version").output().is_err() {
        return Some("nft is not installed");
    }
    None
}

/// Runs `test` on a thread in a new network namespace.
fn in_private_netns(test: impl FnOnce() + Send + 'static) {
    let outcome = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare the network");
        test();
    })
    .join();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn port(name: &str, mac: [u8; 6], ip: [u8; 4]) -> Element {
    let mut key = name.as_bytes().to_vec();
    key.resize(16, 0);
    key.extend_from_slice(&mac);
    key.extend_from_slice(&[0, 0]);
    key.extend_from_slice(&ip);
    Element { key, key_end: None }
}

fn address(ip: [u8; 4]) -> Element {
    Element {
        key: ip.to_vec(),
        key_end: None,
    }
}

fn pair(ip: [u8; 4], first: [u8; 4], last: [u8; 4]) -> Element {
    Element {
        key: [ip, first].concat(),
        key_end: Some([ip, last].concat()),
    }
}

#[test]
fn elements_added_in_a_batch_are_listed_and_deleted_ones_are_gone() {
    if let Some(why) = skip_reason() {
        println!("SKIP: {why}");
        return;
    }
    in_private_netns(|| {
        nft(&["-f", "-"], Some(RULESET));
        let bound = port("wv-1-2", [0x02, 0x77, 10, 77, 1, 2], [10, 77, 1, 2]);
        let granted = address([10, 77, 1, 2]);
        let web = pair([10, 77, 1, 2], [198, 51, 100, 0], [198, 51, 100, 255]);
        let mut batch = Batch::new();
        batch.add(PORTS, bound.clone(), "port");
        batch.add(INTERNET, granted.clone(), "10.77.1.2");
        batch.add(PAIRS, web.clone(), "10.77.1.2 . 198.51.100.0/24");
        batch.commit().expect("add");

        let ports = nft(&["list", "set", "bridge", "wt", "ports"], None);
        assert!(
            ports.contains("\"wv-1-2\" . 02:77:0a:4d:01:02 . 10.77.1.2"),
            "{ports}"
        );
        let pairs = nft(&["list", "set", "ip", "wt", "pairs"], None);
        assert!(pairs.contains("10.77.1.2 . 198.51.100.0/24"), "{pairs}");
        assert!(nft(&["list", "set", "ip", "wt", "internet"], None).contains("10.77.1.2"));
        assert_eq!(nftables::list(PORTS).unwrap(), vec![bound.clone()]);
        assert_eq!(nftables::list(PAIRS).unwrap(), vec![web.clone()]);
        assert_eq!(nftables::list(INTERNET).unwrap(), vec![granted.clone()]);

        // Adding what is there already succeeds and changes nothing.
        let mut again = Batch::new();
        again.add(INTERNET, granted.clone(), "10.77.1.2");
        again.commit().expect("add again");
        assert_eq!(nftables::list(INTERNET).unwrap().len(), 1);

        let mut batch = Batch::new();
        batch.delete(PORTS, bound, "port");
        batch.delete(INTERNET, granted, "10.77.1.2");
        batch.delete(PAIRS, web, "10.77.1.2 . 198.51.100.0/24");
        batch.commit().expect("delete");
        assert!(!nft(&["list", "set", "bridge", "wt", "ports"], None).contains("wv-1-2"));
        assert!(!nft(&["list", "set", "ip", "wt", "pairs"], None).contains("10.77.1.2"));
        assert!(!nft(&["list", "set", "ip", "wt", "internet"], None).contains("10.77.1.2"));
        assert!(nftables::list(PAIRS).unwrap().is_empty());
    });
}

#[test]
fn a_batch_with_one_refused_change_applies_nothing_and_names_the_element() {
    if let Some(why) = skip_reason() {
        println!("SKIP: {why}");
        return;
    }
    in_private_netns(|| {
        nft(&["-f", "-"], Some(RULESET));
        let mut batch = Batch::new();
        batch.add(INTERNET, address([10, 77, 0, 5]), "10.77.0.5");
        batch.delete(INTERNET, address([10, 77, 0, 6]), "10.77.0.6");
        let error = batch
            .commit()
            .expect_err("deleting a missing element fails");
        match &error {
            NftError::Refused { what, source } => {
                assert_eq!(what, "delete element 10.77.0.6 of set ip wt internet");
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(error.to_string().contains("10.77.0.6"), "{error}");
        // All or nothing: the add in the same batch did not happen either.
        assert!(nftables::list(INTERNET).unwrap().is_empty());

        // A set that does not exist: the error names it.
        let missing = SetRef {
            family: Family::Ip,
            table: "wt",
            set: "absent",
        };
        let mut batch = Batch::new();
        batch.add(missing, address([10, 77, 0, 7]), "10.77.0.7");
        let error = batch.commit().expect_err("no such set");
        assert!(error.to_string().contains("ip wt absent"), "{error}");
        let listing = nftables::list(missing).expect_err("no such set to list");
        assert!(listing.to_string().contains("absent"), "{listing}");

        // Overlapping intervals of one source are refused by the kernel (the firewall never sends
        // them: it keeps only the outermost networks of a list).
        let mut batch = Batch::new();
        batch.add(
            PAIRS,
            pair([10, 77, 1, 2], [10, 0, 0, 0], [10, 255, 255, 255]),
            "10.77.1.2 . 10.0.0.0/8",
        );
        batch.commit().expect("first interval");
        let mut batch = Batch::new();
        batch.add(
            PAIRS,
            pair([10, 77, 1, 2], [10, 1, 0, 0], [10, 1, 255, 255]),
            "10.77.1.2 . 10.1.0.0/16",
        );
        let error = batch.commit().expect_err("an overlapping interval");
        assert!(error.to_string().contains("10.1.0.0/16"), "{error}");
    });
}
