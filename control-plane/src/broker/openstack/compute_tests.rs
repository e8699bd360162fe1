//! Nova: the create body, the user-data limit, whose server a name is, and status -> facts.

use super::*;

const CLOUD: &str = "http://127.0.0.1:5000/v3";
const RID: &str = "6f1c2d3e-0000-4000-8000-000000000001";

fn server(status: &str, resource: Option<&str>) -> Server {
    Server {
        id: "srv-1".into(),
        name: format!("pr-{RID}"),
        status: status.into(),
        metadata: resource
            .map(|r| BTreeMap::from([(META_RESOURCE.to_owned(), r.to_owned())]))
            .unwrap_or_default(),
        fault: None,
        task_state: None,
    }
}

#[test]
fn user_data_is_base64_and_at_most_65535_bytes_of_it() {
    assert_eq!(
        user_data("#cloud-config\n").unwrap(),
        "I2Nsb3VkLWNvbmZpZwo="
    );
    // Base64 takes 4 bytes per started 3: 49,149 bytes encode to 65,532, 49,150 to 65,536.
    assert_eq!(user_data(&"a".repeat(49_149)).unwrap().len(), 65_532);
    let e = user_data(&"a".repeat(49_150)).unwrap_err();
    assert_eq!(
        e,
        "the machine's cloud-init document is 49150 bytes, 65536 bytes as base64, more than the 65535 bytes Nova accepts as user_data; shorten it (fewer packages or files in the blueprint)"
    );
}

#[test]
fn the_create_body_carries_everything_and_only_what_is_set() {
    let meta = BTreeMap::from([(META_RESOURCE.to_owned(), RID.to_owned())]);
    let mut placement = Placement {
        image_id: "img".into(),
        flavor_id: "flv".into(),
        network_id: "net".into(),
        key_name: None,
        config_drive: false,
        availability_zone: None,
    };
    assert_eq!(
        create_body("pr-x", &meta, "dXNlcg==", &placement),
        json!({"server": {
            "name": "pr-x", "imageRef": "img", "flavorRef": "flv",
            "networks": [{"uuid": "net"}],
            "metadata": {"plexsphere-resource-id": RID},
            "user_data": "dXNlcg==", "config_drive": false
        }})
    );
    placement.key_name = Some("ops".into());
    placement.config_drive = true;
    placement.availability_zone = Some("nova".into());
    let body = create_body("pr-x", &meta, "dXNlcg==", &placement);
    assert_eq!(body["server"]["key_name"], "ops");
    assert_eq!(body["server"]["config_drive"], true);
    assert_eq!(body["server"]["availability_zone"], "nova");
}

#[test]
fn a_server_of_that_name_with_other_metadata_is_someone_elses() {
    let name = format!("pr-{RID}");
    let mut other_name = server("ACTIVE", Some(RID));
    other_name.name = format!("pr-{RID}-2");
    let found = ours(vec![server("ACTIVE", Some(RID)), other_name], &name, RID).unwrap();
    assert_eq!(found.len(), 1);
    let e = ours(vec![server("ACTIVE", None)], &name, RID).unwrap_err();
    assert_eq!(
        e,
        format!(
            "a server named {name} (srv-1) exists and is not this resource's (its plexsphere-resource-id is missing); rename or delete it, then create the resource again"
        )
    );
    let e = ours(vec![server("ACTIVE", Some("another"))], &name, RID).unwrap_err();
    assert!(e.contains("its plexsphere-resource-id is another"), "{e}");
}

#[test]
fn statuses_map_to_observations() {
    let obs = |status: &str, deleting| observations(&server(status, Some(RID)), deleting, CLOUD);
    assert_eq!(
        obs("BUILD", false).unwrap(),
        vec![Observation::SubstrateAccepted]
    );
    assert_eq!(
        obs("ACTIVE", false).unwrap(),
        vec![Observation::SubstrateAccepted, Observation::MachineBooted]
    );
    assert_eq!(
        obs("HARD_REBOOT", false).unwrap(),
        vec![Observation::SubstrateAccepted]
    );
    let e = obs("SHUTOFF", false).unwrap_err();
    assert!(e.contains("is SHUTOFF, not running"), "{e}");
    // While the resource is being deleted only its disappearance counts.
    assert_eq!(obs("SHUTOFF", true).unwrap(), vec![]);
    assert_eq!(obs("ERROR", true).unwrap(), vec![]);
    assert_eq!(obs("SOFT_DELETED", false).unwrap(), vec![]);
    assert!(is_deleted(&server("DELETED", Some(RID))));
}

#[test]
fn an_error_server_fails_with_novas_fault() {
    let recorded: serde_json::Value = serde_json::from_str(include_str!(
        "testdata/nova_server_error_no_valid_host.json"
    ))
    .unwrap();
    let s: Server = serde_json::from_value(recorded["server"].clone()).unwrap();
    let e = observations(&s, false, CLOUD).unwrap_err();
    assert_eq!(
        e,
        format!(
            "Nova of the cloud {CLOUD} put the server pr-oscap-3 (e3eff0cf-943e-416c-99c8-0aa5b422bf60) in ERROR: No valid host was found. (code 500); no compute host can take it: pick a smaller flavor or another availability zone, or ask the cloud's operator about capacity"
        )
    );
    let mut bare = server("ERROR", Some(RID));
    bare.fault = None;
    assert!(
        observations(&bare, false, CLOUD)
            .unwrap_err()
            .contains("Nova gives no fault message")
    );
}
