//! The error mapping, over answers recorded from the lab cloud (testdata/README.md).

use super::*;

const CLOUD: &str = "http://127.0.0.1:5000/v3";

fn failed(e: SubstrateError) -> String {
    match e {
        SubstrateError::Failed(s) => s,
        SubstrateError::Unreachable(s) => panic!("expected Failed, got Unreachable: {s}"),
    }
}

#[test]
fn service_messages_come_out_of_each_services_shape() {
    assert_eq!(
        service_message(include_bytes!("testdata/nova_400_image_not_found.body")),
        "Can not find requested image"
    );
    assert_eq!(
        service_message(include_bytes!("testdata/keystone_401.body")),
        "The request you have made requires authentication."
    );
    assert_eq!(
        service_message(include_bytes!("testdata/neutron_401.body")),
        "The request you have made requires authentication."
    );
    assert_eq!(
        service_message(include_bytes!("testdata/glance_404.body")),
        "404 Not Found No image found with ID 11111111-2222-3333-4444-555555555555"
    );
    let long = "x".repeat(5000);
    assert_eq!(
        service_message(long.as_bytes()).chars().count(),
        MAX_MESSAGE_CHARS + 1
    );
}

#[test]
fn a_refused_credential_names_it_and_says_rotate() {
    let e = failed(refused_credential(
        CLOUD,
        "2795",
        include_bytes!("testdata/keystone_401.body"),
    ));
    assert_eq!(
        e,
        "Keystone refused the cloud credential 2795 (cloud http://127.0.0.1:5000/v3): The request you have made requires authentication.; create a new application credential and rotate it with `plexctl cloud-credential rotate`"
    );
}

#[test]
fn nova_refusals_say_which_parameter_to_fix() {
    let what = "creating the server pr-x";
    let cases: [(&[u8], u16, &str); 5] = [
        (
            include_bytes!("testdata/nova_400_image_not_found.body"),
            400,
            "check imageName",
        ),
        (
            include_bytes!("testdata/nova_400_flavor_not_found.body"),
            400,
            "check flavorName",
        ),
        (
            include_bytes!("testdata/nova_400_network_not_found.body"),
            400,
            "check networkName",
        ),
        (
            include_bytes!("testdata/nova_400_flavor_disk_too_small.body"),
            400,
            "pick a larger flavor (flavorName) or a smaller image",
        ),
        (
            include_bytes!("testdata/nova_403_quota.body"),
            403,
            "the project's quota is used up",
        ),
    ];
    for (body, status, advice) in cases {
        let e = failed(from_status(CLOUD, "Nova", what, status, body));
        assert!(
            e.starts_with(&format!(
                "Nova of the cloud {CLOUD} refused {what} ({status}: "
            )),
            "{e}"
        );
        assert!(e.contains(advice), "{e}");
    }
    let e = failed(from_status(
        CLOUD,
        "Nova",
        what,
        403,
        include_bytes!("testdata/nova_403_quota.body"),
    ));
    assert!(
        e.contains("Quota exceeded for ram: Requested 4000000, but already used 0 of 51200 ram"),
        "{e}"
    );
}

#[test]
fn overload_and_outages_are_unreachable() {
    for status in [429, 500, 502, 503] {
        match from_status(CLOUD, "Nova", "listing flavors", status, b"{}") {
            SubstrateError::Unreachable(s) => {
                assert!(s.contains("asks again on its next pass"), "{s}");
                assert!(s.contains(CLOUD), "{s}");
            }
            e => panic!("{status}: {e:?}"),
        }
    }
    match transport(
        CLOUD,
        "Keystone",
        "signing in",
        "cannot connect: connection refused",
    ) {
        SubstrateError::Unreachable(s) => assert_eq!(
            s,
            "cannot reach Keystone of the cloud http://127.0.0.1:5000/v3 for signing in: cannot connect: connection refused; the broker asks again on its next pass"
        ),
        e => panic!("{e:?}"),
    }
}
