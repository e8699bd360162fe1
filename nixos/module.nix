# services.plexd: the plexsphere node agent on NixOS.
#
# Writes /etc/plexd/config.yaml (the same keys `plexd install` writes on other distributions),
# places the control plane's CA at /etc/plexd/ca.crt, and runs `plexd run` under a systemd
# service equivalent to systemd/plexd.service (Type=notify, StateDirectory=plexd, the same
# hardening). See nixos/README.md.
{ config, lib, pkgs, ... }:

let
  cfg = config.services.plexd;
  yaml = pkgs.formats.yaml { };

  configDir = "/etc/plexd";
  caPath = "${configDir}/ca.crt";
  stateDir = "/var/lib/plexd";
  tokenDir = builtins.dirOf cfg.tokenFile;

  # Keys left null are omitted, so plexd applies its own defaults.
  baseSettings = lib.filterAttrsRecursive (_: v: v != null) {
    api_url = cfg.apiUrl;
    token_file = cfg.tokenFile;
    state_dir = stateDir;
    tls = {
      ca_file = if cfg.caFile != null then caPath else null;
    };
    registration = {
      project_id = cfg.projectId;
      resource_handle = cfg.resourceHandle;
    };
  };
  # Drop sections that ended up empty (e.g. `tls: {}` without a CA).
  settings = lib.filterAttrs (_: v: v != { }) (lib.recursiveUpdate baseSettings cfg.extraConfig);
in
{
  options.services.plexd = {
    enable = lib.mkEnableOption "plexd, the plexsphere WireGuard mesh node agent";

    package = lib.mkOption {
      type = lib.types.package;
      description = ''
        The plexd package; its `bin/plexd` is run. plexd is not in nixpkgs: build it from this
        repository or wrap a release binary (see nixos/README.md).
      '';
    };

    apiUrl = lib.mkOption {
      type = lib.types.str;
      example = "https://plexsphere.10-0-0-1.nip.io";
      description = "The control plane's origin (`api_url`). Must be https.";
    };

    tokenFile = lib.mkOption {
      type = lib.types.str;
      default = "${configDir}/bootstrap-token";
      example = "/run/secrets/plexd-bootstrap-token";
      description = ''
        The file holding the single-use bootstrap token (`token_file`). A string, not a Nix
        path, so the secret never lands in the world-readable Nix store. plexd removes it after
        a successful registration; a node that is already enrolled does not need it.
      '';
    };

    caFile = lib.mkOption {
      type = lib.types.nullOr lib.types.path;
      default = null;
      example = lib.literalExpression "./lab-ca.crt";
      description = ''
        A PEM file of the CA the control plane's certificate chains to. It is installed as
        /etc/plexd/ca.crt and named in `tls.ca_file`; plexd trusts it besides the system
        store. A CA certificate is public, so a Nix path is fine here.
      '';
    };

    projectId = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "019a0816-0000-7000-8000-000000000002";
      description = "The Project to register into (`registration.project_id`); must match the token's.";
    };

    resourceHandle = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      description = "A handle naming this machine in the control plane (`registration.resource_handle`).";
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Open UDP 51820, the port WireGuard peers reach this node on.";
    };

    extraConfig = lib.mkOption {
      type = yaml.type;
      default = { };
      example = { log.level = "debug"; tls.ca_sha256 = "<hex of the CA's SHA-256>"; };
      description = ''
        Further keys of /etc/plexd/config.yaml, merged over the ones the options above set.
        plexd refuses unknown keys, so a typo stops the service with a message naming it.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = lib.hasPrefix "https://" cfg.apiUrl || (cfg.extraConfig.allow_insecure_http or false);
        message = "services.plexd.apiUrl must start with https:// (plain http only with extraConfig.allow_insecure_http behind a TLS proxy).";
      }
      {
        assertion = !lib.hasPrefix builtins.storeDir cfg.tokenFile;
        message = "services.plexd.tokenFile points into the Nix store, which everyone can read; keep the bootstrap token outside it (e.g. /etc/plexd/bootstrap-token, mode 0600).";
      }
    ];

    environment.etc = {
      "plexd/config.yaml".source = yaml.generate "plexd-config.yaml" settings;
    } // lib.optionalAttrs (cfg.caFile != null) {
      "plexd/ca.crt".source = cfg.caFile;
    };

    environment.systemPackages = [ cfg.package ];

    networking.firewall.allowedUDPPorts = lib.mkIf cfg.openFirewall [ 51820 ];

    systemd.services.plexd = {
      description = "plexsphere node agent (WireGuard mesh)";
      documentation = [ "https://example.invalid/plexsphere" ];
      wantedBy = [ "multi-user.target" ];
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      restartTriggers = [ config.environment.etc."plexd/config.yaml".source ];
      environment = {
        PLEXD_CONFIG = "${configDir}/config.yaml";
        PLEXD_STATE_DIR = stateDir;
      };
      serviceConfig = {
        Type = "notify";
        NotifyAccess = "main";
        ExecStart = "${cfg.package}/bin/plexd run";
        ExecReload = "${pkgs.coreutils}/bin/kill -HUP $MAINPID";
        Restart = "on-failure";
        RestartSec = "5s";
        # 10 token consumed, 11 token invalid, 15 node revoked or deleted, 16 state dir
        # copied from another host, 64 usage, 78 bad config: a restart fixes none.
        RestartPreventExitStatus = "10 11 15 16 64 78";
        # The event loop sends WATCHDOG=1 every 30 s; SIGTERM stops it at once.
        WatchdogSec = "60s";
        TimeoutStopSec = "15s";
        # The packet threads ahead of the applications, as systemd/plexd.service says.
        Nice = -20;

        StateDirectory = "plexd";
        StateDirectoryMode = "0700";
        ConfigurationDirectory = "plexd";
        ConfigurationDirectoryMode = "0700";
        # /run/plexd: the status socket; /run/wireguard: the userspace data plane's UAPI socket.
        RuntimeDirectory = [ "plexd" "wireguard" ];
        RuntimeDirectoryMode = "0700";

        # Hardening, the same as systemd/plexd.service.
        CapabilityBoundingSet = [ "CAP_NET_ADMIN" ];
        AmbientCapabilities = [ "CAP_NET_ADMIN" ];
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        # plexd removes the bootstrap token after joining; "-" ignores a directory not there.
        ReadWritePaths = [ configDir ] ++ lib.optional (tokenDir != configDir) "-${tokenDir}";
        ProtectHome = true;
        PrivateTmp = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        ProtectClock = true;
        ProtectHostname = true;
        ProtectProc = "invisible";
        ProcSubset = "pid";
        DevicePolicy = "closed";
        DeviceAllow = [ "/dev/net/tun rw" ];
        RestrictAddressFamilies = [ "AF_UNIX" "AF_INET" "AF_INET6" "AF_NETLINK" ];
        RestrictNamespaces = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        LockPersonality = true;
        MemoryDenyWriteExecute = true;
        SystemCallArchitectures = "native";
        SystemCallFilter = [ "@system-service" "~@privileged" ];
        SystemCallErrorNumber = "EPERM";
        UMask = "0077";
      };
    };
  };
}
