//! What the TUN device hands the data plane: a virtio-net header and a packet that the kernel
//! (or a local process writing to the TUN) made. Splitting never panics and never produces a
//! packet larger than the slot; what it produces coalesces back without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexd_dataplane::batch::{MAX_PACKET, PacketBatch};
use plexd_dataplane::coalesce::Coalescer;
use plexd_dataplane::offload::{MAX_SEGMENTS, VNET_HDR_LEN, VnetHdr, split};

fuzz_target!(|data: &[u8]| {
    if data.len() < VNET_HDR_LEN {
        assert!(VnetHdr::parse(data).is_err());
        return;
    }
    let Ok(hdr) = VnetHdr::parse(&data[..VNET_HDR_LEN]) else {
        return;
    };
    let mut packet = data[VNET_HDR_LEN..].to_vec();
    let mut out = PacketBatch::for_packets(MAX_SEGMENTS);
    if split(hdr, &mut packet, &mut out).is_err() {
        return;
    }
    assert!(out.len() <= MAX_SEGMENTS);
    for (p, _) in out.iter() {
        assert!(p.len() <= MAX_PACKET);
    }
    let mut coalescer = Coalescer::new();
    let mut written = 0usize;
    let _ = coalescer.writes(&out, |parts| {
        assert_eq!(parts[0].len(), VNET_HDR_LEN);
        let len: usize = parts[1..].iter().map(|p| p.len()).sum();
        assert!(len <= MAX_PACKET);
        if parts.len() > 2 {
            // A merged segment: it splits back into packets that fit, as the host would.
            let hdr = VnetHdr::parse(&parts[0]).expect("the coalescer's own header");
            let mut merged: Vec<u8> = parts[1..].iter().flat_map(|p| p.iter().copied()).collect();
            let mut again = PacketBatch::for_packets(MAX_SEGMENTS);
            assert!(
                split(hdr, &mut merged, &mut again).is_ok(),
                "a merged segment splits"
            );
        }
        written += 1;
        Ok::<(), ()>(())
    });
    assert!(written <= out.len());
});
