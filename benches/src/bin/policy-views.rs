//! `policy-views RULES OUT_A OUT_B A_IP B_IP`: writes the compiled policy views of two nodes
//! a and b (JSON, what their signed states would carry) under a `RULES`-rule policy that lets
//! a open tcp/udp 9 and 5201 and icmp on b ([`plexsphere_benches::policy_views`]); wg-bench
//! hands them to plexd-wg (`PLEXD_WG_POLICY_VIEWS`).

use std::net::Ipv4Addr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [rules, out_a, out_b, a, b] = args.as_slice() else {
        eprintln!("usage: policy-views RULES OUT_A OUT_B A_IP B_IP");
        return ExitCode::from(64);
    };
    let (Ok(rules), Ok(a), Ok(b)) = (
        rules.parse::<usize>(),
        a.parse::<Ipv4Addr>(),
        b.parse::<Ipv4Addr>(),
    ) else {
        eprintln!("policy-views: RULES is a number, A_IP and B_IP IPv4 addresses");
        return ExitCode::from(64);
    };
    let (va, vb) = plexsphere_benches::policy_views(rules, a, b);
    for (path, view) in [(out_a, va), (out_b, vb)] {
        let written = serde_json::to_vec(&view)
            .map_err(|e| e.to_string())
            .and_then(|json| std::fs::write(path, json).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("policy-views: cannot write {path}: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
