//! A Linux TUN device through /dev/net/tun (`TUNSETIFF` with `IFF_TUN | IFF_NO_PI`).
//!
//! With offloads on (`IFF_VNET_HDR` + `TUNSETOFFLOAD` TSO4/TSO6/CSUM), every read and write
//! carries a virtio-net header: the host's TCP hands us up to 64 KiB per read, which
//! `offload::split` cuts into packets, and `Coalescer` merges what we write back (see
//! `crate::offload`). Where the kernel has UDP segmentation offload (`TUN_F_USO4|USO6`, Linux
//! 6.2), it is asked for too, so a `UDP_SEGMENT` sender's super-datagram reaches us whole
//! and `offload::split` cuts it; an older kernel refuses the flags and we ask again without
//! them. The three ioctls are the only unsafe code; reads and writes go through
//! `std::fs::File` on the non-blocking descriptor, waits through `poll`.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::libc;
use nix::poll::PollFlags;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

use crate::batch::{MAX_PACKET, PacketBatch};
use crate::coalesce::Coalescer;
use crate::io::Tun;
use crate::offload::{self, VNET_HDR_LEN, VnetHdr};

nix::ioctl_write_ptr_bad!(tunsetiff, libc::TUNSETIFF, libc::ifreq);
nix::ioctl_write_ptr_bad!(siocsifmtu, libc::SIOCSIFMTU, libc::ifreq);
nix::ioctl_write_int_bad!(tunsetoffload, libc::TUNSETOFFLOAD);

/// Why the TUN device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TunError {
    #[error(
        "interface name `{0}` is not 1-15 characters without `/`, spaces or `%`; pick a shorter name"
    )]
    Name(String),
    #[error(
        "cannot open /dev/net/tun ({0}); load the tun module (modprobe tun) and run as root or with CAP_NET_ADMIN"
    )]
    Open(io::Error),
    #[error(
        "cannot create TUN interface `{name}` ({source}); is the name taken by a non-TUN interface, and is CAP_NET_ADMIN there?"
    )]
    Create { name: String, source: nix::Error },
    #[error("cannot set the MTU of `{name}` to {mtu} ({source})")]
    Mtu {
        name: String,
        mtu: u32,
        source: nix::Error,
    },
    #[error("cannot make the TUN descriptor non-blocking ({0})")]
    NonBlocking(nix::Error),
}

/// A TUN interface this process created; the kernel removes it when the descriptor closes.
pub struct LinuxTun {
    file: File,
    name: String,
    /// Present when the TUN carries virtio-net headers (offloads on).
    offload: Option<Offload>,
    /// Whether the kernel took UDP segmentation offload (USO) too.
    uso: bool,
}

/// The read scratch buffer and the coalescer; each is used by one thread only.
struct Offload {
    read: Mutex<Vec<u8>>,
    coalescer: Mutex<Coalescer>,
}

fn ifreq(name: &str) -> Result<libc::ifreq, TunError> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || bytes.iter().any(|b| matches!(b, b'/' | b' ' | b'%' | 0))
    {
        return Err(TunError::Name(name.to_owned()));
    }
    let mut ifr_name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (dst, src) in ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(libc::ifreq {
        ifr_name,
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_ifindex: 0 },
    })
}

impl LinuxTun {
    /// Creates (or attaches to an existing, unused) TUN interface `name` with MTU `mtu`;
    /// `offload` asks for TSO/GRO through virtio-net headers, and USO where the kernel has it
    /// (falls back without them).
    pub fn create(name: &str, mtu: u32, offload: bool) -> Result<Self, TunError> {
        Self::create_with(name, mtu, offload, offload)
    }

    /// As [`LinuxTun::create`], with USO asked for only when `uso` (a switch to measure it).
    pub fn create_with(name: &str, mtu: u32, offload: bool, uso: bool) -> Result<Self, TunError> {
        if offload {
            if uso {
                match Self::open(name, mtu, true, true) {
                    Ok(tun) => return Ok(tun),
                    Err(e) => {
                        tracing::info!(interface = name, error = %e, "TUN UDP segmentation offload unavailable (Linux 6.2 and later have it); continuing with TCP offloads");
                    }
                }
            }
            match Self::open(name, mtu, true, false) {
                Ok(tun) => return Ok(tun),
                Err(e) => {
                    tracing::warn!(interface = name, error = %e, "TUN offloads unavailable; continuing without them");
                }
            }
        }
        Self::open(name, mtu, false, false)
    }

    fn open(name: &str, mtu: u32, offload: bool, uso: bool) -> Result<Self, TunError> {
        let mut req = ifreq(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map_err(TunError::Open)?;
        let vnet = if offload { libc::IFF_VNET_HDR } else { 0 };
        // The flags fit in a c_short (0x0001 | 0x1000 | 0x4000).
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI | vnet) as libc::c_short;
        // SAFETY: the descriptor is an open /dev/net/tun; `req` is a fully initialised ifreq
        // that lives across the call, and TUNSETIFF reads (and may write back) only that struct.
        unsafe { tunsetiff(file.as_raw_fd(), &req) }.map_err(|source| TunError::Create {
            name: name.to_owned(),
            source,
        })?;
        if offload {
            let mut flags = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
            if uso {
                flags |= libc::TUN_F_USO4 | libc::TUN_F_USO6;
            }
            // SAFETY: the descriptor is our TUN with IFF_VNET_HDR; TUNSETOFFLOAD takes the
            // flags by value and touches no memory of ours.
            unsafe { tunsetoffload(file.as_raw_fd(), flags as libc::c_int) }.map_err(|source| {
                TunError::Create {
                    name: name.to_owned(),
                    source,
                }
            })?;
        }
        fcntl(file.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(TunError::NonBlocking)?;
        let tun = Self {
            file,
            name: name.to_owned(),
            offload: offload.then(|| Offload {
                read: Mutex::new(vec![0; VNET_HDR_LEN + MAX_PACKET]),
                coalescer: Mutex::new(Coalescer::new()),
            }),
            uso: offload && uso,
        };
        tun.set_mtu(mtu)?;
        Ok(tun)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when reads and writes carry virtio-net headers (TSO/GRO on).
    pub fn offloads(&self) -> bool {
        self.offload.is_some()
    }

    /// True when the kernel hands us UDP super-datagrams too (USO on).
    pub fn uso(&self) -> bool {
        self.uso
    }

    fn set_mtu(&self, mtu: u32) -> Result<(), TunError> {
        let err = |source| TunError::Mtu {
            name: self.name.clone(),
            mtu,
            source,
        };
        let mut req = ifreq(&self.name)?;
        req.ifr_ifru.ifru_mtu = libc::c_int::try_from(mtu).map_err(|_| err(nix::Error::EINVAL))?;
        let sock: OwnedFd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(err)?;
        // SAFETY: `sock` is an open socket; `req` is a fully initialised ifreq naming our
        // interface, alive across the call; SIOCSIFMTU only reads it.
        unsafe { siocsifmtu(sock.as_raw_fd(), &req) }.map_err(err)?;
        Ok(())
    }

    fn wait(&self, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
        super::poll::wait_fd(self.file.as_fd(), flags, timeout)
    }
}

impl LinuxTun {
    /// Reads whole GSO segments and splits them into the batch.
    fn recv_offload(
        &self,
        o: &Offload,
        batch: &mut PacketBatch,
        timeout: Duration,
    ) -> io::Result<usize> {
        let mut buf = o.read.lock().unwrap_or_else(PoisonError::into_inner);
        super::poll::fill(
            batch,
            timeout,
            |batch| {
                let n = (&self.file).read(&mut buf[..])?;
                if n > VNET_HDR_LEN {
                    let (head, packet) = buf[..n].split_at_mut(VNET_HDR_LEN);
                    let split = VnetHdr::parse(head).and_then(|h| offload::split(h, packet, batch));
                    if let Err(e) = split {
                        tracing::debug!(error = %e, "dropped a packet the host handed us");
                    }
                }
                Ok(super::poll::Read::Done)
            },
            |t| self.wait(PollFlags::POLLIN, t),
        )
    }

    fn write_one(&self, parts: &[IoSlice<'_>]) -> io::Result<bool> {
        let mut result = (&self.file).write_vectored(parts);
        if matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            && self.wait(PollFlags::POLLOUT, Duration::from_millis(10))?
        {
            result = (&self.file).write_vectored(parts);
        }
        match result {
            Ok(_) => Ok(true),
            // The host refused this packet (malformed, queue full): the rest go on.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EIO | libc::EAGAIN)
                ) =>
            {
                tracing::trace!(error = %e, "TUN refused a packet");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn recv_plain(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        super::poll::fill(
            batch,
            timeout,
            |batch| {
                let n = (&self.file).read(batch.next_slot())?;
                batch.commit(n, crate::batch::NO_ADDR);
                Ok(super::poll::Read::Done)
            },
            |t| self.wait(PollFlags::POLLIN, t),
        )
    }

    fn send_plain(&self, batch: &PacketBatch) -> io::Result<usize> {
        let mut sent = 0;
        for (packet, _) in batch.iter() {
            match (&self.file).write(packet) {
                Ok(_) => sent += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The host's queue is full; wait a moment once, then drop like a full queue.
                    if self.wait(PollFlags::POLLOUT, Duration::from_millis(10))?
                        && (&self.file).write(packet).is_ok()
                    {
                        sent += 1;
                    }
                }
                // EINVAL/EIO: the host refused this packet (malformed); the rest go on.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO)) => {
                    tracing::trace!(error = %e, "TUN refused a packet");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }
}

impl Tun for LinuxTun {
    fn recv(&self, batch: &mut PacketBatch, timeout: Duration) -> io::Result<usize> {
        match &self.offload {
            Some(o) => self.recv_offload(o, batch, timeout),
            None => self.recv_plain(batch, timeout),
        }
    }

    fn send(&self, batch: &PacketBatch) -> io::Result<usize> {
        let Some(o) = &self.offload else {
            return self.send_plain(batch);
        };
        let mut coalescer = o.coalescer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sent = 0;
        coalescer.writes(batch, |parts| {
            sent += usize::from(self.write_one(parts)?);
            Ok::<(), io::Error>(())
        })?;
        Ok(sent)
    }
}
