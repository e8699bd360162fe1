use super::*;

const RESOURCE: &str = r#"{"id":"019fb9d7-fb6c-7681-a082-07407e041cc0","project_id":"019a0816-0000-7000-8000-000000000001","kind":"bucket","origin":"provisioned","blueprint_version_id":"5b2f0c6e-0000-5000-8000-00000000b00c","cloud_credential_id":"019a0816-0000-7000-8000-0000000000cc","parameters":{"region":"us-east-1"},"provisioning":{"phase":"Provisioning","reason":null,"observed_at":"2026-11-30T14:31:12Z","history":[{"phase":"Pending","observed":"the declaration was accepted","at":"2026-11-30T14:31:02Z"},{"phase":"Provisioning","observed":"the substrate accepted the composite","at":"2026-11-30T14:31:12Z"}]},"node_id":null,"created_at":"2026-11-30T14:31:02Z"}"#;

fn resource_fixture() -> Resource {
    serde_json::from_str(RESOURCE).unwrap()
}

#[test]
fn the_resource_json_is_printed_as_the_server_sent_it() {
    let r = resource_fixture();
    let printed: Value = serde_json::from_str(&crate::output::json(&r).unwrap()).unwrap();
    let sent: Value = serde_json::from_str(RESOURCE).unwrap();
    assert_eq!(printed, sent);
    assert_eq!(printed["provisioning"]["phase"], "Provisioning");
    // Fields plexctl does not know survive too.
    let mut extra: Value = sent.clone();
    extra["future_field"] = Value::from(7);
    let r: Resource = serde_json::from_value(extra.clone()).unwrap();
    assert_eq!(serde_json::to_value(&r).unwrap(), extra);
}

#[test]
fn an_answer_that_is_not_a_resource_is_refused() {
    let err = serde_json::from_str::<Resource>(r#"{"id":"x"}"#).unwrap_err();
    assert!(err.to_string().contains("invalid"), "{err}");
}

#[test]
fn created_list_and_get_tables() {
    let r = resource_fixture();
    assert_eq!(
        created(&r),
        "ID                                    KIND    PHASE         PROJECT\n\
         019fb9d7-fb6c-7681-a082-07407e041cc0  bucket  Provisioning  019a0816-0000-7000-8000-000000000001\n"
    );
    assert_eq!(
        resources(std::slice::from_ref(&r)),
        "ID                                    KIND    PHASE         SINCE                 NODE  PROJECT\n\
         019fb9d7-fb6c-7681-a082-07407e041cc0  bucket  Provisioning  2026-11-30T14:31:12Z  -     019a0816-0000-7000-8000-000000000001\n"
    );
    assert_eq!(
        resource(&r),
        "id:                 019fb9d7-fb6c-7681-a082-07407e041cc0\n\
         kind:               bucket\n\
         origin:             provisioned\n\
         phase:              Provisioning\n\
         since:              2026-11-30T14:31:12Z\n\
         reason:             -\n\
         project:            019a0816-0000-7000-8000-000000000001\n\
         blueprint version:  5b2f0c6e-0000-5000-8000-00000000b00c\n\
         cloud credential:   019a0816-0000-7000-8000-0000000000cc\n\
         parameters:         {\"region\":\"us-east-1\"}\n\
         node:               -\n\
         created:            2026-11-30T14:31:02Z\n\
         history:\n\
         \x20 2026-11-30T14:31:02Z  Pending       the declaration was accepted\n\
         \x20 2026-11-30T14:31:12Z  Provisioning  the substrate accepted the composite\n"
    );
}

#[test]
fn credential_table_never_has_a_payload() {
    let c: CredentialView = serde_json::from_str(
        r#"{"id":"019a0816-0000-7000-8000-0000000000cc","name":"lab","provider":"local","created_at":"2026-11-30T10:00:00Z","revoked_at":null}"#,
    )
    .unwrap();
    let mut revoked = c.clone();
    revoked.name = "old os".into();
    revoked.provider = "openstack".into();
    revoked.revoked_at = Some(time::macros::datetime!(2026-11-30 12:00:00 UTC));
    assert_eq!(
        credentials(&[c, revoked]),
        "ID                                    NAME    PROVIDER   CREATED               REVOKED\n\
         019a0816-0000-7000-8000-0000000000cc  lab     local      2026-11-30T10:00:00Z  -\n\
         019a0816-0000-7000-8000-0000000000cc  old os  openstack  2026-11-30T10:00:00Z  2026-11-30T12:00:00Z\n"
    );
}

#[test]
fn blueprint_table_names_the_required_parameters() {
    let items: Items<Value> = serde_json::from_str(
        r#"{"items":[
          {"version_id":"5b2f0c6e-0000-5000-8000-00000000b00c","name":"local-bucket","version":"v1",
           "resource_kind":"bucket","class":"standalone","substrate":"local-directory",
           "parameters":{"region":{"type":"string","required":true},"size":{"type":"integer","default":1}}},
          {"version_id":"5b2f0c6e-0000-5000-8000-00000000b00d","name":"openstack-instance","version":"v1",
           "resource_kind":"node","class":"machine","substrate":"crossplane",
           "parameters":{"networkName":{"type":"string","required":true},"imageName":{"type":"string","required":true},
                         "availabilityZone":{"type":"string"}}},
          {"version_id":"5b2f0c6e-0000-5000-8000-00000000b00e","name":"local-machine","version":"v2",
           "resource_kind":"node","class":"machine","substrate":"local-machine","parameters":{}}
        ]}"#,
    )
    .unwrap();
    assert_eq!(
        blueprints(&items.items),
        "VERSION ID                            NAME                VERSION  KIND    CLASS       SUBSTRATE        REQUIRED PARAMETERS\n\
         5b2f0c6e-0000-5000-8000-00000000b00c  local-bucket        v1       bucket  standalone  local-directory  region\n\
         5b2f0c6e-0000-5000-8000-00000000b00d  openstack-instance  v1       node    machine     crossplane       imageName,networkName\n\
         5b2f0c6e-0000-5000-8000-00000000b00e  local-machine       v2       node    machine     local-machine    -\n"
    );
    let list =
        serde_json::json!([{"name": "b", "required": true}, {"name": "a", "required": false}]);
    assert_eq!(required_parameters(Some(&list)), ["b"]);
    assert!(required_parameters(None).is_empty());
}
