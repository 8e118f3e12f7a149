//! nf_tables set elements over netlink (`NETLINK_NETFILTER`), without starting `nft`.
//!
//! What a sandbox holds in the shared tables is only set elements (see [`super::firewall`]), so the
//! per-sandbox work is adding and deleting elements, and listing a set. Changes go to the kernel as
//! one batch (`NFNL_MSG_BATCH_BEGIN`, one `NEWSETELEM`/`DELSETELEM` message per element,
//! `NFNL_MSG_BATCH_END`): the kernel applies all of them or none. Every message asks for an
//! acknowledgement, and an error names the element it was about. nftables has no stable netlink
//! crate for Rust (the bindings to libnftnl need the C library, and the pure-Rust ones cover rules
//! rather than the concatenated and interval keys these sets use), and this is three message types,
//! so the encoder is written here; the layout follows `linux/netfilter/nf_tables.h` and was checked
//! against what `nft` sends (the unit tests hold those bytes).
//!
//! A netlink socket talks to the network namespace of the thread that opened it; a batch runs in
//! the caller's namespace, synchronously (the kernel processes a batch inside the `sendmsg` call).

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;

/// How long to wait for the kernel's answer before giving up (it answers within the send; this
/// only bounds a kernel that does not).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("open a netfilter netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("send to netfilter")]
    Send(#[source] std::io::Error),
    #[error("read netfilter's answer")]
    Receive(#[source] std::io::Error),
    /// The kernel refused one change of a batch, described in `what` (e.g. "delete element
    /// 10.77.0.6 of set ip warren internet"); the batch was not applied.
    #[error("{what}")]
    Refused {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("commit the batch")]
    Commit(#[source] std::io::Error),
    #[error("list set {set}")]
    List {
        set: String,
        #[source]
        source: std::io::Error,
    },
    #[error("netfilter's answer is malformed: {0}")]
    Malformed(&'static str),
    #[error("netfilter did not acknowledge {0} of the batch's messages")]
    Unacknowledged(usize),
}

/// The address family of a table (`NFPROTO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Ip,
    Bridge,
}

impl Family {
    fn code(self) -> u8 {
        match self {
            Family::Ip => 2,
            Family::Bridge => 7,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Bridge => "bridge",
        }
    }
}

/// A set of table `table` in family `family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetRef<'a> {
    pub family: Family,
    pub table: &'a str,
    pub set: &'a str,
}

impl std::fmt::Display for SetRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.family.name(), self.table, self.set)
    }
}

/// A netfilter hook of the inet families (`NF_INET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Output = 3,
}

/// Where a payload expression reads (`NFT_PAYLOAD_*_HEADER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    Network = 1,
}

/// What a meta expression loads (`NFT_META_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey {
    OifName = 7,
    L4Proto = 16,
}

/// The expressions of a rule this module writes; each loads into or compares register 1 (the
/// first 16-byte register), or sets the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Meta(MetaKey),
    Payload {
        base: PayloadBase,
        offset: u32,
        len: u32,
    },
    /// Compares register 1 with `data`: equal, or (`negate`) not equal.
    Cmp {
        negate: bool,
        data: Vec<u8>,
    },
    /// Rejects a TCP packet with a reset.
    RejectTcpReset,
    Drop,
}

/// Register 1, as rules name it (`NFT_REG_1`); register 0 is the verdict.
const REG_1: u32 = 1;

impl Expr {
    fn encode(&self, buf: &mut Vec<u8>) {
        let item = nest_start(buf, NFTA_LIST_ELEM);
        let name = match self {
            Expr::Meta(_) => "meta",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::RejectTcpReset => "reject",
            Expr::Drop => "immediate",
        };
        attr_str(buf, NFTA_EXPR_NAME, name);
        let data = nest_start(buf, NFTA_EXPR_DATA);
        let be = |v: u32| v.to_be_bytes();
        match self {
            Expr::Meta(key) => {
                attr(buf, 2, &be(*key as u32)); // NFTA_META_KEY
                attr(buf, 1, &be(REG_1)); // NFTA_META_DREG
            }
            Expr::Payload { base, offset, len } => {
                attr(buf, 1, &be(REG_1)); // NFTA_PAYLOAD_DREG
                attr(buf, 2, &be(*base as u32)); // NFTA_PAYLOAD_BASE
                attr(buf, 3, &be(*offset)); // NFTA_PAYLOAD_OFFSET
                attr(buf, 4, &be(*len)); // NFTA_PAYLOAD_LEN
            }
            Expr::Cmp { negate, data } => {
                attr(buf, 1, &be(REG_1)); // NFTA_CMP_SREG
                attr(buf, 2, &be(u32::from(*negate))); // NFTA_CMP_OP: NFT_CMP_EQ, NFT_CMP_NEQ
                let value = nest_start(buf, 3); // NFTA_CMP_DATA
                attr(buf, NFTA_DATA_VALUE, data);
                nest_end(buf, value);
            }
            Expr::RejectTcpReset => {
                attr(buf, 1, &be(1)); // NFTA_REJECT_TYPE: NFT_REJECT_TCP_RST
                attr(buf, 2, &[0]); // NFTA_REJECT_ICMP_CODE
            }
            Expr::Drop => {
                attr(buf, 1, &be(0)); // NFTA_IMMEDIATE_DREG: the verdict register
                let value = nest_start(buf, 2); // NFTA_IMMEDIATE_DATA
                let verdict = nest_start(buf, NFTA_DATA_VERDICT);
                attr(buf, NFTA_VERDICT_CODE, &be(NF_DROP));
                nest_end(buf, verdict);
                nest_end(buf, value);
            }
        }
        nest_end(buf, data);
        nest_end(buf, item);
    }
}

/// A set element as the kernel stores it: the key in the set's data layout (each field of a
/// concatenation padded to 4 bytes), and for an interval of a concatenated set, the inclusive
/// last key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub key: Vec<u8>,
    pub key_end: Option<Vec<u8>>,
}

/// One message of a batch: its type, flags and attributes, and what it does (for errors).
#[derive(Debug, Clone)]
struct Change {
    kind: u16,
    flags: u16,
    family: Family,
    attributes: Vec<u8>,
    what: String,
}

/// Element changes applied in one transaction ([`Batch::commit`]). Adding an element that is there
/// already succeeds; deleting one that is not fails the batch (add it first in the same batch to
/// delete whatever was there).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    changes: Vec<Change>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// Adds `element` (reading `label` in errors) to `set`.
    pub fn add(&mut self, set: SetRef<'_>, element: Element, label: impl std::fmt::Display) {
        self.element(
            NFT_MSG_NEWSETELEM,
            NLM_F_CREATE,
            set,
            &element,
            "add",
            label,
        );
    }

    /// Deletes `element` from `set`.
    pub fn delete(&mut self, set: SetRef<'_>, element: Element, label: impl std::fmt::Display) {
        self.element(NFT_MSG_DELSETELEM, 0, set, &element, "delete", label);
    }

    fn element(
        &mut self,
        kind: u16,
        flags: u16,
        set: SetRef<'_>,
        element: &Element,
        op: &str,
        label: impl std::fmt::Display,
    ) {
        let mut attributes = Vec::new();
        attr_str(&mut attributes, NFTA_SET_ELEM_LIST_TABLE, set.table);
        attr_str(&mut attributes, NFTA_SET_ELEM_LIST_SET, set.set);
        let elements = nest_start(&mut attributes, NFTA_SET_ELEM_LIST_ELEMENTS);
        encode_element(&mut attributes, element);
        nest_end(&mut attributes, elements);
        self.changes.push(Change {
            kind,
            flags,
            family: set.family,
            attributes,
            what: format!("{op} element {label} of set {set}"),
        });
    }

    /// Adds table `name` of `family` (nothing happens if it exists).
    pub fn add_table(&mut self, family: Family, name: &str) {
        let mut attributes = Vec::new();
        attr_str(&mut attributes, NFTA_TABLE_NAME, name);
        attr(&mut attributes, NFTA_TABLE_FLAGS, &0u32.to_be_bytes());
        self.changes.push(Change {
            kind: NFT_MSG_NEWTABLE,
            flags: NLM_F_CREATE,
            family,
            attributes,
            what: format!("add table {} {name}", family.name()),
        });
    }

    /// Adds base chain `chain` of table `table` on `hook` at `priority`, of type filter, whose
    /// policy is accept.
    pub fn add_filter_chain(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        hook: Hook,
        priority: i32,
    ) {
        let mut attributes = Vec::new();
        attr_str(&mut attributes, NFTA_CHAIN_TABLE, table);
        attr_str(&mut attributes, NFTA_CHAIN_NAME, chain);
        attr_str(&mut attributes, NFTA_CHAIN_TYPE, "filter");
        attr(&mut attributes, NFTA_CHAIN_POLICY, &NF_ACCEPT.to_be_bytes());
        let nest = nest_start(&mut attributes, NFTA_CHAIN_HOOK);
        attr(
            &mut attributes,
            NFTA_HOOK_HOOKNUM,
            &(hook as u32).to_be_bytes(),
        );
        attr(&mut attributes, NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
        nest_end(&mut attributes, nest);
        self.changes.push(Change {
            kind: NFT_MSG_NEWCHAIN,
            flags: NLM_F_CREATE,
            family,
            attributes,
            what: format!("add chain {} {table} {chain}", family.name()),
        });
    }

    /// Appends a rule made of `expressions` to chain `chain` of table `table`; `label` is how it
    /// reads in nft's syntax (for errors).
    pub fn add_rule(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        expressions: &[Expr],
        label: &str,
    ) {
        let mut attributes = Vec::new();
        attr_str(&mut attributes, NFTA_RULE_TABLE, table);
        attr_str(&mut attributes, NFTA_RULE_CHAIN, chain);
        let list = nest_start(&mut attributes, NFTA_RULE_EXPRESSIONS);
        for expression in expressions {
            expression.encode(&mut attributes);
        }
        nest_end(&mut attributes, list);
        self.changes.push(Change {
            kind: NFT_MSG_NEWRULE,
            flags: NLM_F_CREATE | NLM_F_APPEND,
            family,
            attributes,
            what: format!("add rule {} {table} {chain} {label}", family.name()),
        });
    }

    /// The batch as netlink messages, numbered from `first_seq` (the begin marker has `first_seq`,
    /// the changes the numbers after it, the end marker the last).
    fn encode(&self, first_seq: u32) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64 + self.changes.len() * 128);
        batch_marker(&mut buf, NFNL_MSG_BATCH_BEGIN, first_seq);
        for (i, change) in self.changes.iter().enumerate() {
            let start = message(
                &mut buf,
                change.kind,
                NLM_F_REQUEST | NLM_F_ACK | change.flags,
                first_seq + 1 + i as u32,
                change.family,
            );
            buf.extend_from_slice(&change.attributes);
            message_end(&mut buf, start);
        }
        batch_marker(
            &mut buf,
            NFNL_MSG_BATCH_END,
            first_seq + 1 + self.changes.len() as u32,
        );
        buf
    }

    /// Applies every change, or none. An error names the first element the kernel refused.
    pub fn commit(&self) -> Result<(), NftError> {
        if self.changes.is_empty() {
            return Ok(());
        }
        let socket = Socket::open()?;
        let first_seq = socket.next_seq(self.changes.len() as u32 + 2);
        socket.send(&self.encode(first_seq))?;
        let mut pending = vec![true; self.changes.len()];
        let mut left = self.changes.len();
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = socket.receive(&mut buf)?;
            for answer in Messages::new(&buf[..n]) {
                let answer = answer?;
                if answer.kind != NLMSG_ERROR {
                    continue;
                }
                let errno = answer.errno()?;
                let index = answer.seq.wrapping_sub(first_seq + 1) as usize;
                let Some(change) = self.changes.get(index) else {
                    // The begin or end marker: the whole batch failed (e.g. at commit).
                    if errno != 0 {
                        return Err(NftError::Commit(std::io::Error::from_raw_os_error(errno)));
                    }
                    continue;
                };
                if errno != 0 {
                    return Err(NftError::Refused {
                        what: change.what.clone(),
                        source: std::io::Error::from_raw_os_error(errno),
                    });
                }
                if std::mem::take(&mut pending[index]) {
                    left -= 1;
                }
            }
        }
        Ok(())
    }
}

/// The attribute bytes of a rule's expression list (what goes inside `NFTA_RULE_EXPRESSIONS`).
#[cfg(test)]
pub(crate) fn expressions_bytes(expressions: &[Expr]) -> Vec<u8> {
    let mut buf = Vec::new();
    for expression in expressions {
        expression.encode(&mut buf);
    }
    buf
}

/// Every element of `set`.
pub fn list(set: SetRef<'_>) -> Result<Vec<Element>, NftError> {
    let socket = Socket::open()?;
    let seq = socket.next_seq(1);
    socket.send(&encode_list(set, seq))?;
    let failed = |source| NftError::List {
        set: set.to_string(),
        source,
    };
    let mut elements = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.receive(&mut buf)?;
        for answer in Messages::new(&buf[..n]) {
            let answer = answer?;
            if answer.seq != seq {
                continue;
            }
            match answer.kind {
                NLMSG_DONE => return Ok(elements),
                NLMSG_ERROR => {
                    let errno = answer.errno()?;
                    if errno != 0 {
                        return Err(failed(std::io::Error::from_raw_os_error(errno)));
                    }
                }
                _ => decode_elements(answer.payload, &mut elements)?,
            }
        }
    }
}

fn encode_list(set: SetRef<'_>, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    let start = message(
        &mut buf,
        NFT_MSG_GETSETELEM,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        set.family,
    );
    attr_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, set.table);
    attr_str(&mut buf, NFTA_SET_ELEM_LIST_SET, set.set);
    message_end(&mut buf, start);
    buf
}

/// A netlink socket to netfilter in the calling thread's network namespace.
struct Socket {
    fd: OwnedFd,
}

/// Sequence numbers only need to tell this process's requests apart on one socket; a process-wide
/// counter keeps them distinct anyway.
static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl Socket {
    fn open() -> Result<Self, NftError> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| NftError::Socket(e.into()))?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
            .map_err(|e| NftError::Socket(e.into()))?;
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        socket::setsockopt(&fd, socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| NftError::Socket(e.into()))?;
        Ok(Self { fd })
    }

    /// Reserves `count` consecutive sequence numbers and returns the first.
    fn next_seq(&self, count: u32) -> u32 {
        SEQ.fetch_add(count, std::sync::atomic::Ordering::Relaxed)
    }

    fn send(&self, buf: &[u8]) -> Result<(), NftError> {
        let sent = socket::sendto(
            self.fd.as_raw_fd(),
            buf,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|e| NftError::Send(e.into()))?;
        if sent != buf.len() {
            return Err(NftError::Send(std::io::Error::other("short send")));
        }
        Ok(())
    }

    fn receive(&self, buf: &mut [u8]) -> Result<usize, NftError> {
        loop {
            match socket::recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
                Ok(n) => return Ok(n),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(NftError::Receive(e.into())),
            }
        }
    }
}

/// Starts a message (netlink header, then the nfnetlink header) and returns where it starts;
/// [`message_end`] writes its length.
fn message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: Family) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // length, written by message_end
    buf.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    buf.push(family.code());
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&0u16.to_be_bytes()); // resource id
    start
}

fn message_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// A batch begin or end marker (addressed to the nftables subsystem).
fn batch_marker(buf: &mut Vec<u8>, kind: u16, seq: u32) {
    buf.extend_from_slice(&20u32.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(0); // AF_UNSPEC
    buf.push(0);
    buf.extend_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
    buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(data);
    pad(buf);
}

/// A NUL-terminated string attribute.
fn attr_str(buf: &mut Vec<u8>, kind: u16, text: &str) {
    buf.extend_from_slice(&((4 + text.len() + 1) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(text.as_bytes());
    buf.push(0);
    pad(buf);
}

fn nest_start(buf: &mut Vec<u8>, kind: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&(NLA_F_NESTED | kind).to_ne_bytes());
    start
}

fn nest_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn encode_element(buf: &mut Vec<u8>, element: &Element) {
    let item = nest_start(buf, NFTA_LIST_ELEM);
    let key = nest_start(buf, NFTA_SET_ELEM_KEY);
    attr(buf, NFTA_DATA_VALUE, &element.key);
    nest_end(buf, key);
    if let Some(end) = &element.key_end {
        let key_end = nest_start(buf, NFTA_SET_ELEM_KEY_END);
        attr(buf, NFTA_DATA_VALUE, end);
        nest_end(buf, key_end);
    }
    nest_end(buf, item);
}

/// One netlink message of an answer.
struct Answer<'a> {
    kind: u16,
    #[cfg_attr(not(test), allow(dead_code))]
    flags: u16,
    seq: u32,
    /// What follows the netlink header.
    payload: &'a [u8],
}

impl Answer<'_> {
    /// The (positive) errno of an `NLMSG_ERROR`; 0 is an acknowledgement.
    fn errno(&self) -> Result<i32, NftError> {
        let bytes = self
            .payload
            .get(..4)
            .ok_or(NftError::Malformed("short error message"))?;
        Ok(-i32::from_ne_bytes(bytes.try_into().expect("4 bytes")))
    }
}

/// The messages in one datagram.
struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { rest: buf }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Answer<'a>, NftError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes(self.rest[0..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > self.rest.len() {
            self.rest = &[];
            return Some(Err(NftError::Malformed("bad message length")));
        }
        let kind = u16::from_ne_bytes(self.rest[4..6].try_into().expect("2 bytes"));
        let flags = u16::from_ne_bytes(self.rest[6..8].try_into().expect("2 bytes"));
        let seq = u32::from_ne_bytes(self.rest[8..12].try_into().expect("4 bytes"));
        let payload = &self.rest[16..len];
        let aligned = (len + 3) & !3;
        self.rest = self.rest.get(aligned..).unwrap_or(&[]);
        Some(Ok(Answer {
            kind,
            flags,
            seq,
            payload,
        }))
    }
}

/// The attributes in `buf`, as (type without flags, data).
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), NftError>> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            buf = &[];
            return Some(Err(NftError::Malformed("bad attribute length")));
        }
        let data = &buf[4..len];
        buf = buf.get((len + 3) & !3..).unwrap_or(&[]);
        Some(Ok((kind, data)))
    })
}

/// The value inside a `NFTA_SET_ELEM_KEY`-style nest.
fn data_value(nest: &[u8]) -> Result<Option<Vec<u8>>, NftError> {
    for item in attributes(nest) {
        let (kind, data) = item?;
        if kind == NFTA_DATA_VALUE {
            return Ok(Some(data.to_vec()));
        }
    }
    Ok(None)
}

/// Appends the elements of one `NEWSETELEM` message of a listing (after the netlink header).
fn decode_elements(payload: &[u8], into: &mut Vec<Element>) -> Result<(), NftError> {
    let attrs = payload
        .get(4..)
        .ok_or(NftError::Malformed("short set element message"))?;
    for item in attributes(attrs) {
        let (kind, data) = item?;
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for element in attributes(data) {
            let (kind, data) = element?;
            if kind != NFTA_LIST_ELEM {
                continue;
            }
            let mut key = None;
            let mut key_end = None;
            for field in attributes(data) {
                let (kind, data) = field?;
                match kind {
                    NFTA_SET_ELEM_KEY => key = data_value(data)?,
                    NFTA_SET_ELEM_KEY_END => key_end = data_value(data)?,
                    _ => {}
                }
            }
            if let Some(key) = key {
                into.push(Element { key, key_end });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTS: SetRef<'static> = SetRef {
        family: Family::Bridge,
        table: "warren",
        set: "ports",
    };

    fn hex(text: &str) -> Vec<u8> {
        let digits: String = text.split_whitespace().collect();
        (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The bytes after the nfnetlink header of the change message, less `NFTA_SET_ELEM_LIST_SET_ID`
    /// (nft names the set by its id too; the name is enough).
    fn change_attributes(batch: &Batch) -> Vec<u8> {
        let buf = batch.encode(7);
        let messages: Vec<Answer> = Messages::new(&buf).map(Result::unwrap).collect();
        assert_eq!(messages.len(), 3);
        messages[1].payload[4..].to_vec()
    }

    /// Recorded once from `strace -e sendmsg -xx nft add element bridge warren ports { "wv-1-2" .
    /// 02:77:0a:4d:01:02 . 10.77.1.2 }` (nftables 1.0.6): table, set, then the element nest.
    #[test]
    fn a_port_binding_is_encoded_as_nft_encodes_it() {
        let mut key = b"wv-1-2".to_vec();
        key.resize(16, 0);
        key.extend_from_slice(&[0x02, 0x77, 0x0a, 0x4d, 0x01, 0x02, 0, 0]);
        key.extend_from_slice(&[10, 77, 1, 2]);
        let mut batch = Batch::new();
        batch.add(PORTS, Element { key, key_end: None }, "x");
        let nft = hex("0b00 0100 7761 7272 656e 0000
             0a00 0200 706f 7274 7300 0000
             2c00 0380 2800 0180 2400 0180 2000 0100
             7776 2d31 2d32 0000 0000 0000 0000 0000
             0277 0a4d 0102 0000 0a4d 0102");
        assert_eq!(change_attributes(&batch), nft);
    }

    /// Recorded from `nft add element ip warren egress_allow { 10.77.1.2 . 198.51.100.0/24 }` on a
    /// set `type ipv4_addr . ipv4_addr; flags interval`: the key and the inclusive end key.
    #[test]
    fn an_interval_of_a_concatenation_carries_its_last_key() {
        let set = SetRef {
            family: Family::Ip,
            table: "warren",
            set: "egress_allow",
        };
        let mut batch = Batch::new();
        batch.add(
            set,
            Element {
                key: vec![10, 77, 1, 2, 198, 51, 100, 0],
                key_end: Some(vec![10, 77, 1, 2, 198, 51, 100, 255]),
            },
            "x",
        );
        let nft = hex("0b00 0100 7761 7272 656e 0000
             1100 0200 6567 7265 7373 5f61 6c6c 6f77 0000 0000
             2800 0380 2400 0180 1000 0180 0c00 0100 0a4d 0102 c633 6400
             1000 0a80 0c00 0100 0a4d 0102 c633 64ff");
        assert_eq!(change_attributes(&batch), nft);
    }

    #[test]
    fn a_batch_is_framed_and_numbered() {
        let mut batch = Batch::new();
        let element = Element {
            key: vec![10, 77, 0, 9],
            key_end: None,
        };
        let internet = SetRef {
            family: Family::Ip,
            table: "warren",
            set: "internet",
        };
        batch.add(internet, element.clone(), "10.77.0.9");
        batch.delete(internet, element, "10.77.0.9");
        let buf = batch.encode(100);
        let messages: Vec<Answer> = Messages::new(&buf).map(Result::unwrap).collect();
        let kinds: Vec<u16> = messages.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            vec![
                NFNL_MSG_BATCH_BEGIN,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELSETELEM,
                NFNL_MSG_BATCH_END
            ]
        );
        let seqs: Vec<u32> = messages.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, vec![100, 101, 102, 103]);
        // The markers address the nftables subsystem; the changes the table's family.
        assert_eq!(messages[0].payload, &[0, 0, 0, 10]);
        assert_eq!(messages[1].payload[0], 2);
        // Flags: request + create + ack for an add, request + ack for a delete.
        let flags: Vec<u16> = messages.iter().map(|m| m.flags).collect();
        assert_eq!(
            flags,
            vec![
                NLM_F_REQUEST,
                NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
                NLM_F_REQUEST | NLM_F_ACK,
                NLM_F_REQUEST
            ]
        );
    }

    #[test]
    fn a_listing_is_decoded_back_into_elements() {
        // A NEWSETELEM message of a dump: nfgenmsg, table, set, then two elements.
        let mut buf = Vec::new();
        let start = message(&mut buf, NFT_MSG_NEWSETELEM, 0, 1, Family::Ip);
        attr_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, "warren");
        attr_str(&mut buf, NFTA_SET_ELEM_LIST_SET, "egress_deny");
        let elements = nest_start(&mut buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        let one = Element {
            key: vec![10, 77, 1, 2, 0, 0, 0, 0],
            key_end: Some(vec![10, 77, 1, 2, 255, 255, 255, 255]),
        };
        let two = Element {
            key: vec![10, 77, 1, 3, 1, 2, 3, 4],
            key_end: Some(vec![10, 77, 1, 3, 1, 2, 3, 4]),
        };
        encode_element(&mut buf, &one);
        encode_element(&mut buf, &two);
        nest_end(&mut buf, elements);
        message_end(&mut buf, start);
        let answer = Messages::new(&buf).next().unwrap().unwrap();
        let mut got = Vec::new();
        decode_elements(answer.payload, &mut got).unwrap();
        assert_eq!(got, vec![one, two]);
        // A truncated attribute is an error, not a panic.
        let mut short = answer.payload.to_vec();
        short.truncate(short.len() - 3);
        assert!(decode_elements(&short, &mut Vec::new()).is_err());
    }
}
