//! Hands the pages of exported VMM blocks to receiving processes.
//!
//! A page handle travels between processes only as a POSIX file descriptor
//! (`cuMemExportToShareableHandle`), and a descriptor only over a Unix
//! socket (`SCM_RIGHTS`); a legacy IPC handle is 64 bytes the program passes
//! however it likes. So an export is published here under a ticket that the
//! sealed handle carries, and the exporter's broker thread, started with the
//! first export, answers a receiver that presents the ticket with the pages'
//! descriptors. The thread makes no CUDA call but the export of each
//! descriptor, and holds no lock of the pool's.
//!
//! The socket is abstract (`\0cupool-ipc-<pid>-<nonce>`, gone with the
//! process; the random nonce, carried in the ticket, keeps processes of
//! other PID namespaces and a reused pid apart). Each side checks that the
//! other is the same user (or root), and a ticket's random token must
//! match, so nothing but the exported block is ever handed out. Each
//! connection is answered on a thread of its own. Replies carry
//! at most `CHUNK` descriptors each, which the receiver imports and closes
//! before reading on: a block of thousands of pages never holds thousands
//! of descriptors open.

use super::Ticket;
use crate::cuda::{Status, INVALID_VALUE, SUCCESS};
use crate::pool::PoolHandle;
use crate::runtime::fds::KeptFd;
use parking_lot::Mutex;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

/// Descriptors per reply message (SCM_RIGHTS allows 253).
const CHUNK: usize = 64;
/// A receiver gives up on a broker that does not answer.
const TIMEOUT_S: i64 = 20;

/// An exported block's pages, as the broker serves them.
struct Export {
    token: u64,
    /// The `ContextPool` the pages belong to: its death ends the export.
    pool: PoolHandle,
    /// The block's address: exported again, it keeps its ticket, as CUDA
    /// gives one allocation one handle.
    block: u64,
    /// Page handles and sizes, by address.
    pages: Vec<(u64, u64)>,
    /// Where the block starts in its first page.
    offset: u64,
}

struct Exports {
    /// The process the list and the broker belong to (a forked child starts afresh).
    pid: u32,
    /// The broker's socket name part (0: no broker).
    nonce: u64,
    list: Vec<Option<Export>>,
}

static EXPORTS: Mutex<Exports> = Mutex::new(Exports { pid: 0, nonce: 0, list: Vec::new() });

/// The broker's listening socket (a forked child closes its copy), kept out
/// of the program's way: the broker must never accept on a socket of the
/// program's that took its number.
static LISTENER: KeptFd = KeptFd::new();

/// Request: id (u32), pad (u32), token (u64).
const REQUEST: usize = 16;
/// Reply header: status (u32), total pages (u32), offset (u64), pages here (u32), pad (u32).
const HEADER: usize = 24;

fn socket_name(pid: u32, nonce: u64) -> String {
    format!("cupool-ipc-{pid}-{nonce:016x}")
}

/// This process's broker, when it has one: `ticket` is one of its own.
pub fn is_own(ticket: &Ticket) -> bool {
    let exports = EXPORTS.lock();
    ticket.pid == std::process::id() && exports.pid == ticket.pid && exports.nonce == ticket.nonce
}

/// How a page handle becomes a descriptor (`pages::export_fd`: the
/// broker's one CUDA call, made on its own thread).
pub type ExportFd = fn(u64) -> Result<OwnedFd, Status>;

/// Publishes the pages of the block at `block` (`offset` into the first)
/// exported from `pool`; returns the ticket its handle carries. `Err`: the
/// broker could not be started.
pub fn publish(
    pool: PoolHandle,
    block: u64,
    pages: Vec<(u64, u64)>,
    offset: u64,
    export_fd: ExportFd,
) -> Result<Ticket, Status> {
    let pid = std::process::id();
    let mut exports = EXPORTS.lock();
    if exports.pid != pid {
        *exports = Exports { pid, nonce: 0, list: Vec::new() };
    }
    if exports.nonce == 0 {
        let nonce = random_u64();
        start(pid, nonce, export_fd).map_err(|e| {
            crate::runtime::diag::error(&format!("cannot start the IPC broker for VMM blocks: {e}"));
            INVALID_VALUE
        })?;
        exports.nonce = nonce;
    }
    let nonce = exports.nonce;
    let known = exports.list.iter().position(|e| e.as_ref().is_some_and(|e| e.pool == pool && e.block == block));
    if let Some(i) = known {
        let token = exports.list[i].as_ref().map_or(0, |e| e.token);
        return Ok(Ticket { pid, nonce, id: i as u32 + 1, token });
    }
    let token = random_u64();
    exports.list.push(Some(Export { token, pool, block, pages, offset }));
    Ok(Ticket { pid, nonce, id: exports.list.len() as u32, token })
}

/// The context of `pool` died, and its pages with it: its exports end.
pub fn forget_pool(pool: PoolHandle) {
    for e in EXPORTS.lock().list.iter_mut() {
        if e.as_ref().is_some_and(|e| e.pool == pool) {
            *e = None;
        }
    }
}

fn random_u64() -> u64 {
    let mut t = 0u64;
    // SAFETY: `getrandom` writes at most `size_of::<u64>()` bytes through a pointer to `t`, a live local of
    // exactly that size.
    let n = unsafe { libc::getrandom((&mut t as *mut u64).cast(), size_of::<u64>(), 0) };
    if n != size_of::<u64>() as isize {
        // No entropy source: still unlikely to repeat across processes.
        t = crate::runtime::clock::monotonic_ns() ^ ((std::process::id() as u64) << 40);
    }
    t | 1
}

fn address(pid: u32, nonce: u64) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: `sockaddr_un` is an integer and a byte array: all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = socket_name(pid, nonce);
    // Abstract: a leading NUL, no file.
    for (dst, &b) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *dst = b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    (addr, len as libc::socklen_t)
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: `socket` takes no pointers; its result is checked before it is used.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket` (checked non-negative) and nothing else owns it: the
    // `OwnedFd` becomes its one owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Binds the broker's socket, keeps it in `LISTENER` and starts its thread.
fn start(pid: u32, nonce: u64, export_fd: ExportFd) -> io::Result<()> {
    let listener = socket()?;
    let (addr, len) = address(pid, nonce);
    // SAFETY: `addr` is a live `sockaddr_un` and `len` (from `address`) covers only its filled-in prefix;
    // `bind` reads it during the call only. The descriptor is `listener`'s, open here.
    check(unsafe { libc::bind(listener.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: `listen` takes no pointers; the descriptor is `listener`'s, open here.
    check(unsafe { libc::listen(listener.as_raw_fd(), 64) })?;
    LISTENER.keep(listener.into_raw_fd());
    let spawned = std::thread::Builder::new().name("cupool-ipc".into()).spawn(move || serve(export_fd));
    if let Err(e) = spawned {
        LISTENER.close();
        return Err(e);
    }
    Ok(())
}

fn serve(export_fd: ExportFd) {
    loop {
        // -1 (a socket the program took) fails as a listener gone.
        let listener = LISTENER.get().unwrap_or(-1);
        // SAFETY: null address pointers: `accept4` writes nothing of ours. The descriptor is the broker's
        // listening socket (checked to be it), or -1.
        let fd = unsafe { libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
        if fd < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR | libc::ECONNABORTED) => continue,
                // Out of descriptors or memory for now: try again shortly.
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                _ => {
                    // The listener is gone (never expected): later exports
                    // start a new broker; opens of earlier tickets fail.
                    let mut exports = EXPORTS.lock();
                    exports.nonce = 0;
                    LISTENER.close();
                    return;
                }
            }
        }
        // SAFETY: `fd` is the connection `accept4` just returned (checked non-negative); nothing else owns
        // it.
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        if !trusted(conn.as_raw_fd()) {
            continue;
        }
        // A slow or silent client must not hold up the others.
        let spawned = std::thread::Builder::new()
            .name("cupool-ipc-conn".into())
            .spawn(move || crate::runtime::diag::shielded(|| answer(&conn, export_fd)));
        drop(spawned);
    }
}

fn set_timeouts(fd: RawFd) {
    let tv = libc::timeval { tv_sec: TIMEOUT_S, tv_usec: 0 };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: `setsockopt` reads `size_of::<timeval>()` bytes from `tv`, a live `timeval`, during the
        // call; `fd` is the caller's open socket.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as _,
            )
        };
    }
}

/// Is the peer this process's own user, or root?
fn trusted(fd: RawFd) -> bool {
    // SAFETY: `ucred` is three integers: all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `getsockopt` writes at most `len` bytes (the size of `cred`) into `cred` and updates `len`,
    // both live locals; `fd` is the caller's open socket.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    // SAFETY: `geteuid` takes no arguments and cannot fail.
    r == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::geteuid() })
}

fn answer(conn: &OwnedFd, export_fd: ExportFd) -> io::Result<()> {
    let fd = conn.as_raw_fd();
    set_timeouts(fd);
    let mut req = [0u8; REQUEST];
    // SAFETY: `recv` writes at most `REQUEST` bytes into `req`, a live buffer of `REQUEST` bytes; `fd` is
    // `conn`'s, open.
    let n = unsafe { libc::recv(fd, req.as_mut_ptr().cast(), REQUEST, 0) };
    if n != REQUEST as isize {
        return Ok(());
    }
    let id = u32::from_le_bytes(req[0..4].try_into().unwrap());
    let token = u64::from_le_bytes(req[8..16].try_into().unwrap());
    let live = || {
        let exports = EXPORTS.lock();
        let e = exports.list.get((id as usize).wrapping_sub(1))?.as_ref()?;
        (e.token == token).then(|| (e.pages.clone(), e.offset))
    };
    let Some((pages, offset)) = live() else {
        return send(fd, INVALID_VALUE, 0, 0, &[], &[]);
    };
    for chunk in pages.chunks(CHUNK) {
        if live().is_none() {
            // Its context died meanwhile: its handles are gone.
            return send(fd, INVALID_VALUE, 0, 0, &[], &[]);
        }
        let mut fds = Vec::with_capacity(chunk.len());
        for &(handle, _) in chunk {
            match export_fd(handle) {
                Ok(f) => fds.push(f),
                Err(status) => return send(fd, status, 0, 0, &[], &[]),
            }
        }
        let sizes: Vec<u64> = chunk.iter().map(|&(_, size)| size).collect();
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        send(fd, SUCCESS, pages.len() as u32, offset, &sizes, &raw)?;
    }
    Ok(())
}

/// Room for one control message of up to `CHUNK` descriptors, aligned for
/// `cmsghdr` (8 bytes; a `Vec<u8>` promises no alignment).
fn control_buffer() -> Vec<u64> {
    // SAFETY: `CMSG_SPACE` is arithmetic on its argument; it touches no memory.
    let bytes = unsafe { libc::CMSG_SPACE((CHUNK * size_of::<RawFd>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(size_of::<u64>())]
}

fn send(fd: RawFd, status: Status, total: u32, offset: u64, sizes: &[u64], fds: &[RawFd]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(HEADER + 8 * sizes.len());
    msg.extend_from_slice(&(status as u32).to_le_bytes());
    msg.extend_from_slice(&total.to_le_bytes());
    msg.extend_from_slice(&offset.to_le_bytes());
    msg.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
    msg.extend_from_slice(&0u32.to_le_bytes());
    for s in sizes {
        msg.extend_from_slice(&s.to_le_bytes());
    }
    let mut iov = libc::iovec { iov_base: msg.as_mut_ptr().cast(), iov_len: msg.len() };
    let mut control = control_buffer();
    // SAFETY: `msghdr` is integers and pointers: all-zero (null pointers, zero lengths) is a valid value.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        hdr.msg_control = control.as_mut_ptr().cast();
        // SAFETY: `CMSG_SPACE` is arithmetic on its argument; it touches no memory.
        hdr.msg_controllen = unsafe { libc::CMSG_SPACE(bytes as u32) } as _;
        // SAFETY: `control` is 8-byte aligned, as `cmsghdr` needs, and holds `CMSG_SPACE` of `CHUNK`
        // descriptors; `fds` holds at most `CHUNK` (`answer` sends pages in chunks of `CHUNK`, errors none),
        // so `msg_controllen` is within `control` and `CMSG_FIRSTHDR` returns its start (not null: the length
        // covers a header). The header is written in place, and `CMSG_DATA` has room for `bytes`, exactly the
        // `fds.len()` descriptors copied from `fds`, a separate allocation.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: `sendmsg` only reads `hdr` and what it points to (`iov` over `msg`, and `control`), all alive
    // until it returns; `fd` is the caller's open socket.
    let n = unsafe { libc::sendmsg(fd, &hdr, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the broker of `ticket`'s exporter for the block's pages: each is
/// handed to `take` (its descriptor, closed when `take` returns, and its
/// size) in address order. Returns the block's offset into its first page;
/// `Err` is CUDA's error for a handle that cannot be opened.
pub fn fetch(ticket: Ticket, mut take: impl FnMut(RawFd, u64) -> Result<(), Status>) -> Result<u64, Status> {
    let conn = socket().map_err(|_| INVALID_VALUE)?;
    let fd = conn.as_raw_fd();
    set_timeouts(fd);
    let (addr, len) = address(ticket.pid, ticket.nonce);
    // No broker: the exporter is gone, or never exported this.
    // SAFETY: `connect` reads `len` bytes of `addr`, a live `sockaddr_un`, during the call; `fd` is `conn`'s,
    // open.
    check(unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) }).map_err(|_| INVALID_VALUE)?;
    if !trusted(fd) {
        // Another user's socket under the broker's name: nothing from it is mapped.
        return Err(INVALID_VALUE);
    }
    let mut req = [0u8; REQUEST];
    req[0..4].copy_from_slice(&ticket.id.to_le_bytes());
    req[8..16].copy_from_slice(&ticket.token.to_le_bytes());
    // SAFETY: `send` reads `REQUEST` bytes from `req`, a live array of that size; `fd` is `conn`'s, open.
    if unsafe { libc::send(fd, req.as_ptr().cast(), REQUEST, libc::MSG_NOSIGNAL) } != REQUEST as isize {
        return Err(INVALID_VALUE);
    }
    let mut got = 0usize;
    loop {
        let (status, total, offset, sizes, fds) = receive(fd).map_err(|_| INVALID_VALUE)?;
        if status != SUCCESS {
            return Err(status);
        }
        if sizes.len() != fds.len() {
            return Err(INVALID_VALUE);
        }
        for (f, size) in fds.iter().zip(sizes) {
            take(f.as_raw_fd(), size)?;
        }
        got += fds.len();
        if got >= total as usize {
            return if total == 0 { Err(INVALID_VALUE) } else { Ok(offset) };
        }
    }
}

type Reply = (Status, u32, u64, Vec<u64>, Vec<OwnedFd>);

fn receive(fd: RawFd) -> io::Result<Reply> {
    let mut msg = vec![0u8; HEADER + 8 * CHUNK];
    let mut iov = libc::iovec { iov_base: msg.as_mut_ptr().cast(), iov_len: msg.len() };
    let mut control = control_buffer();
    // SAFETY: `msghdr` is integers and pointers: all-zero (null pointers, zero lengths) is a valid value.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(control.as_slice()) as _;
    // SAFETY: `recvmsg` writes at most `msg.len()` bytes into `msg` (through `iov`), at most `msg_controllen`
    // (the size of `control`) into `control`, and fills `hdr`'s lengths and flags: all live locals. `fd` is
    // the caller's open socket.
    let n = unsafe { libc::recvmsg(fd, &mut hdr, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // Every descriptor that arrived is owned (and closed) from here on.
    let mut fds = Vec::new();
    // SAFETY: the walk stays within the control data the kernel wrote: `CMSG_FIRSTHDR`/`CMSG_NXTHDR` bound
    // every header by `msg_controllen`, which `recvmsg` set to at most the size of `control` (8-byte aligned,
    // as `cmsghdr` needs). An `SCM_RIGHTS` message carries `cmsg_len - CMSG_LEN(0)` bytes of descriptors
    // after its header, read unaligned. Each is a descriptor the kernel just installed in this process for
    // this message, owned by nothing else: the `OwnedFd` takes it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    let n = n as usize;
    if n < HEADER || hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::ErrorKind::InvalidData.into());
    }
    let word = |at: usize| u32::from_le_bytes(msg[at..at + 4].try_into().unwrap());
    let (status, total, here) = (word(0) as Status, word(4), word(16) as usize);
    let offset = u64::from_le_bytes(msg[8..16].try_into().unwrap());
    if here > CHUNK || n != HEADER + 8 * here {
        return Err(io::ErrorKind::InvalidData.into());
    }
    let sizes =
        (0..here).map(|i| u64::from_le_bytes(msg[HEADER + 8 * i..HEADER + 8 * i + 8].try_into().unwrap())).collect();
    Ok((status, total, offset, sizes, fds))
}

pub fn lock_for_fork() {
    std::mem::forget(EXPORTS.lock());
}

/// # Safety
/// Only after `lock_for_fork`, in the same thread or its forked child.
pub unsafe fn unlock_after_fork(in_child: bool) {
    EXPORTS.force_unlock();
    if in_child {
        // The parent's broker thread did not come along: its socket must not
        // stay open here (clients would connect and wait for nobody). The
        // child starts a broker of its own when it exports.
        let mut exports = EXPORTS.lock();
        LISTENER.close();
        *exports = Exports { pid: 0, nonce: 0, list: Vec::new() };
    }
}
