"""Facts about deploy/k8s that a schema cannot check (tests/k8s_manifests_test.sh).

    python k8s_manifest_facts.py [-v] DIR

DIR holds ps.yaml, worker.yaml and gpu/worker.yaml. Prints a FAIL line naming
the file, object and field for each broken fact (-v: a PASS line for each
one that holds too), then how many held, and exits 1 if any failed. Needs PyYAML (the kubernetes-validate venv has it).
"""
import re
import subprocess
import sys

import yaml

VERBOSE = False
FAILS = []
PASSES = []


def check(ok, what):
    """Records a fact; prints it only when it fails (or with -v)."""
    if ok:
        PASSES.append(what)
        if VERBOSE:
            print("PASS: " + what)
    else:
        FAILS.append(what)
        print("FAIL: " + what)
    return ok


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def flags_of(container):
    """The binary and --flag=value pairs of the `sh -c "exec BINARY ..."` command."""
    script = " ".join(container.get("command", []) + container.get("args", []))
    m = re.search(r"exec\s+(\S+)\s+(.*)", script, re.S)
    if not m:
        return None, {}
    flags = {}
    for tok in m.group(2).split():
        k, _, v = tok.partition("=")
        flags[k] = v.strip('"')
    return m.group(1), flags


def quantity(q):
    """CPU cores or memory bytes of a Kubernetes quantity (the forms we use)."""
    s = str(q)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for u, f in units.items():
        if s.endswith(u):
            return float(s[: -len(u)]) * f
    return float(s)


def run_command(container, env):
    """The argv the container's command would exec, as the kubelet and /bin/sh
    would build it: $(VAR) in env values expanded from the variables before
    them, then `sh -c` run with `exec BINARY` turned into printing the argv."""
    resolved = dict(env)
    for e in container.get("env", []):
        if "value" in e:
            resolved[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: resolved.get(m.group(1), m.group(0)),
                                         e["value"])
    cmd = list(container.get("command", [])) + list(container.get("args", []))
    if cmd[:2] != ["/bin/sh", "-c"] or len(cmd) != 3:
        return None
    script = re.sub(r"\bexec\s+", "exec printf '%s\\n' ", cmd[2], count=1)
    out = subprocess.run(["/bin/sh", "-c", script], env=resolved, capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else None


def check_statefulset(fname, objs, role, hosts_env):
    sts = objs.get(("StatefulSet", role))
    if not check(sts is not None, f"{fname}: has StatefulSet {role}"):
        return None
    spec = sts["spec"]
    tmpl = spec["template"]
    pod = tmpl["spec"]
    containers = pod["containers"]
    check(len(containers) == 1, f"{fname}: {role} has one container")
    c = containers[0]
    env = env_of(c)
    binary, flags = flags_of(c)
    where = f"{fname}: StatefulSet {role}"

    check(c.get("image") == "towerps:latest", f"{where}: image towerps:latest (got {c.get('image')})")
    check(binary == f"/usr/local/bin/{role}", f"{where}: runs /usr/local/bin/{role} (got {binary})")
    check(flags.get("--job_name") == role, f"{where}: --job_name={role}")
    check(flags.get("--task_index") == "${POD_NAME##*-}",
          f"{where}: --task_index is the pod name's ordinal (got {flags.get('--task_index')})")
    pod_name = env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(pod_name == "metadata.name", f"{where}: POD_NAME from metadata.name")
    ns = env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(ns == "metadata.namespace", f"{where}: POD_NAMESPACE from metadata.namespace")
    # $(POD_NAMESPACE) in a value expands only if it is defined earlier.
    names = [e["name"] for e in c.get("env", [])]
    for var in ("PS_HOSTS", "WORKER_HOSTS"):
        check(var in names and "POD_NAMESPACE" in names and
              names.index("POD_NAMESPACE") < names.index(var),
              f"{where}: POD_NAMESPACE is defined before {var}")
    check(flags.get("--ps_hosts") == "$PS_HOSTS" and flags.get("--worker_hosts") == "$WORKER_HOSTS",
          f"{where}: --ps_hosts/--worker_hosts from $PS_HOSTS/$WORKER_HOSTS")

    # What pod <role>-1 in namespace ns1 would really run.
    limit = str(c.get("resources", {}).get("limits", {}).get("cpu", ""))
    argv = run_command(c, {"POD_NAME": f"{role}-1", "POD_NAMESPACE": "ns1", "CPU_LIMIT": limit,
                           "PATH": "/usr/bin:/bin"})
    if check(argv is not None, f"{where}: the command runs under /bin/sh -c"):
        hosts_ok = all(
            any(re.fullmatch(rf"--{job}_hosts=({job}-\d+\.{job}\.ns1\.svc:\d+,?)+", a) for a in argv)
            for job in ("ps", "worker"))
        check(argv[0] == f"/usr/local/bin/{role}" and "--task_index=1" in argv
              and f"--job_name={role}" in argv and hosts_ok,
              f"{where}: pod {role}-1 in ns1 runs /usr/local/bin/{role} --job_name={role} "
              f"--task_index=1 --ps_hosts=ps-N.ps.ns1.svc:PORT,... (got {argv})")

    # Replicas and the host lists: task i of every role must be pod i of its
    # StatefulSet under its headless Service.
    hosts = env.get(hosts_env, {}).get("value", "").split(",")
    replicas = spec.get("replicas")
    check(replicas == len(hosts),
          f"{where}: replicas ({replicas}) == entries in {hosts_env} ({len(hosts)})")
    svc_name = spec.get("serviceName")
    ports = set()
    for i, h in enumerate(hosts):
        m = re.fullmatch(rf"{re.escape(role)}-{i}\.{re.escape(svc_name)}\.\$\(POD_NAMESPACE\)\.svc:(\d+)", h)
        check(m is not None,
              f"{where}: {hosts_env}[{i}] is {role}-{i}.{svc_name}.$(POD_NAMESPACE).svc:PORT (got {h})")
        if m:
            ports.add(int(m.group(1)))
    check(len(ports) == 1, f"{where}: one port for every {role} task (got {sorted(ports)})")
    port = ports.pop() if len(ports) == 1 else None

    # The Service: headless, publishes starting pods, selects these pods.
    svc = objs.get(("Service", svc_name))
    if check(svc is not None, f"{where}: serviceName {svc_name} is a Service in the same file"):
        check(svc["spec"].get("clusterIP") == "None", f"{fname}: Service {svc_name} is headless")
        check(svc["spec"].get("publishNotReadyAddresses") is True,
              f"{fname}: Service {svc_name} publishes not-ready pods (peers resolve while starting)")
        labels = tmpl["metadata"]["labels"]
        sel = svc["spec"].get("selector", {})
        check(all(labels.get(k) == v for k, v in sel.items()) and sel,
              f"{fname}: Service {svc_name} selects the {role} pods")
        check(spec["selector"]["matchLabels"].items() <= labels.items(),
              f"{where}: selector matches the pod labels")

    # Ports: the container's own port in the hosts list is its containerPort,
    # every probe's, and the Service's.
    cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    check(port is not None and port in cports.values(),
          f"{where}: containerPort {sorted(cports.values())} includes the {hosts_env} port {port}")
    # Issue 15: the probes ask grpc.health.v1 through `towerctl health` over
    # mutual TLS (Kubernetes' grpc probes speak plaintext only), at the task's
    # own port, with a towerctl deadline inside the probe's timeout.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe) or {}
        cmd = p.get("exec", {}).get("command", [])
        if check(cmd[:2] == ["towerctl", "health"],
                 f"{where}: {probe} execs towerctl health (got {cmd or p})"):
            check(f"127.0.0.1:{port}" in cmd,
                  f"{where}: {probe} asks 127.0.0.1:{port}, the {hosts_env} port (got {cmd})")
            t = next((float(a.split("=", 1)[1]) for a in cmd if a.startswith("--timeout_s=")), None)
            check(t is not None and t < p.get("timeoutSeconds", 1),
                  f"{where}: {probe} towerctl --timeout_s ({t}) < timeoutSeconds "
                  f"({p.get('timeoutSeconds', 1)})")
    # Mutual TLS + token on every channel, from Secret towerps-tls.
    tls_vols = {v["name"] for v in pod.get("volumes", [])
                if v.get("secret", {}).get("secretName") == TLS_SECRET}
    tls_mounts = [m for m in c.get("volumeMounts", []) if m["name"] in tls_vols]
    check(len(tls_mounts) == 1 and tls_mounts[0]["mountPath"] == TLS_PATH
          and tls_mounts[0].get("readOnly") is True,
          f"{where}: Secret {TLS_SECRET} mounted read-only at {TLS_PATH} ({tls_mounts})")
    want = {"--tls_cert": f"{TLS_PATH}/node.pem", "--tls_key": f"{TLS_PATH}/node.key",
            "--tls_ca": f"{TLS_PATH}/ca.pem", "--tls_server_name": "towerps",
            "--auth_token_file": f"{TLS_PATH}/token"}
    wrong = {k: flags.get(k) for k, v in want.items() if flags.get(k) != v}
    check(not wrong, f"{where}: TLS and token flags from {TLS_PATH} (wrong: {wrong})")
    want_env = {"TOWERCTL_TLS_CERT": f"{TLS_PATH}/client.pem",
                "TOWERCTL_TLS_KEY": f"{TLS_PATH}/client.key", "TOWERCTL_TLS_CA": f"{TLS_PATH}/ca.pem",
                "TOWERCTL_TLS_SERVER_NAME": "towerps", "TOWERCTL_AUTH_TOKEN_FILE": f"{TLS_PATH}/token"}
    wrong = {k: env.get(k, {}).get("value") for k, v in want_env.items()
             if env.get(k, {}).get("value") != v}
    check(not wrong, f"{where}: towerctl's TLS settings for the probes (wrong: {wrong})")
    if svc is not None:
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort")
            target = cports.get(target) if isinstance(target, str) else target
            check(sp["port"] == port and target == port,
                  f"{fname}: Service {svc_name} port {sp['port']} -> {target} == {port}")

    # Shutdown: the readiness probe must see NOT_SERVING before the port
    # closes, and the kubelet's SIGKILL must come after the drain and the
    # server's own stop (2 s) with room to spare.
    drain = flags.get("--drain_s")
    if check(drain is not None and re.fullmatch(r"\d+(\.\d+)?", drain or ""),
             f"{where}: --drain_s set (got {drain})"):
        drain = float(drain)
        ready = c.get("readinessProbe", {})
        window = ready.get("periodSeconds", 10) * ready.get("failureThreshold", 3)
        check(window <= drain,
              f"{where}: readiness period x failureThreshold ({window} s) <= --drain_s ({drain:g} s)")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        check(grace >= drain + 10,
              f"{where}: terminationGracePeriodSeconds ({grace}) >= --drain_s + 10 ({drain + 10:g})")

    # Resources: requests and limits for CPU and memory, limits >= requests.
    res = c.get("resources", {})
    for r in ("cpu", "memory"):
        req, lim = res.get("requests", {}).get(r), res.get("limits", {}).get(r)
        if check(req is not None and lim is not None, f"{where}: {r} request and limit set"):
            check(quantity(lim) >= quantity(req), f"{where}: {r} limit {lim} >= request {req}")

    # State: every pod mounts the one shared claim (state.yaml) at the same
    # path, since the ps write their shards where the chief reads them.
    claims = {v["name"] for v in pod.get("volumes", [])
              if v.get("persistentVolumeClaim", {}).get("claimName") == SHARED_CLAIM}
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    check(not spec.get("volumeClaimTemplates"), f"{where}: no per-pod volumeClaimTemplates")
    check(claims and claims <= mounts.keys()
          and {mounts[n] for n in claims} == {STATE_PATH},
          f"{where}: claim {SHARED_CLAIM} mounted at {STATE_PATH} ({mounts})")
    # Issue 15: the chief keeps its state and each ps writes its shards only
    # under --state_dir: both on the shared volume's path.
    sd = flags.get("--state_dir", "")
    check(sd == STATE_PATH, f"{where}: --state_dir {sd} is the shared volume's {STATE_PATH}")
    if role == "worker":
        check("--serve" in flags, f"{where}: workers run --serve (worker-0 is the chief)")
        timeout = flags.get("--stop_checkpoint_timeout_s")
        if check(timeout is not None and re.fullmatch(r"\d+(\.\d+)?", timeout or ""),
                 f"{where}: --stop_checkpoint_timeout_s set (got {timeout})"):
            # The others keep serving for their drain while the chief
            # reaches a step boundary and writes the checkpoint.
            check(isinstance(drain, float) and float(timeout) < drain,
                  f"{where}: --stop_checkpoint_timeout_s ({timeout}) < --drain_s ({drain})")
        cpu = env.get("CPU_LIMIT", {}).get("valueFrom", {}).get("resourceFieldRef", {})
        check(flags.get("--blas_threads") == "$CPU_LIMIT" and cpu.get("resource") == "limits.cpu"
              and cpu.get("containerName") == c["name"],
              f"{where}: --blas_threads is the container's own CPU limit")
    if role == "ps":
        blas = env.get("OPENBLAS_NUM_THREADS", {}).get("valueFrom", {}).get("resourceFieldRef", {})
        check(blas.get("resource") == "limits.cpu" and blas.get("containerName") == c["name"],
              f"{where}: OPENBLAS_NUM_THREADS is the container's own CPU limit")
    return sts


SHARED_CLAIM = "towerps-state"
STATE_PATH = "/var/lib/towerps"
TLS_SECRET = "towerps-tls"
TLS_PATH = "/etc/towerps/tls"


def check_state_claim(objs):
    pvc = objs.get(("PersistentVolumeClaim", SHARED_CLAIM))
    if check(pvc is not None, f"state.yaml: PersistentVolumeClaim {SHARED_CLAIM}"):
        check(pvc["spec"].get("accessModes") == ["ReadWriteMany"],
              f"state.yaml: {SHARED_CLAIM} is ReadWriteMany (got {pvc['spec'].get('accessModes')})")


def main():
    global VERBOSE
    args = sys.argv[1:]
    VERBOSE = "-v" in args
    args = [a for a in args if a != "-v"]
    if len(args) != 1:
        sys.exit("usage: k8s_manifest_facts.py [-v] DIR")
    d = args[0]
    ps = load(f"{d}/ps.yaml")
    wk = load(f"{d}/worker.yaml")
    gpu = load(f"{d}/gpu/worker.yaml")
    check_state_claim(load(f"{d}/state.yaml"))
    sets = [check_statefulset("ps.yaml", ps, "ps", "PS_HOSTS"),
            check_statefulset("worker.yaml", wk, "worker", "WORKER_HOSTS"),
            check_statefulset("gpu/worker.yaml", gpu, "worker", "WORKER_HOSTS")]
    sets = [s for s in sets if s is not None]
    # Every task must be given the same cluster.
    for var in ("PS_HOSTS", "WORKER_HOSTS"):
        vals = {env_of(s["spec"]["template"]["spec"]["containers"][0]).get(var, {}).get("value")
                for s in sets}
        check(len(vals) == 1, f"{var} is the same in ps.yaml, worker.yaml and gpu/worker.yaml ({vals})")
    # The StatefulSet that owns a hosts list has as many replicas as every
    # other file's copy of it says (checked per file above); the GPU variant
    # is the CPU worker plus one GPU, nothing else.
    cpu_c = wk[("StatefulSet", "worker")]["spec"]["template"]["spec"]["containers"][0]
    check("nvidia.com/gpu" not in str(cpu_c.get("resources")), "worker.yaml: requests no GPU")
    gpu_sts = gpu[("StatefulSet", "worker")]
    gpu_c = gpu_sts["spec"]["template"]["spec"]["containers"][0]
    for kind in ("requests", "limits"):
        check(str(gpu_c["resources"][kind].pop("nvidia.com/gpu", None)) == "1",
              f"gpu/worker.yaml: resources.{kind} nvidia.com/gpu: 1")
    check(gpu == wk, "gpu/worker.yaml == worker.yaml apart from nvidia.com/gpu")
    if FAILS:
        print(f"facts: {len(PASSES)} hold, {len(FAILS)} failed")
        sys.exit(1)
    print(f"facts: all {len(PASSES)} hold")


if __name__ == "__main__":
    main()
