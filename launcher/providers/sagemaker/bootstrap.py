"""Start torchrun on this SageMaker host. Written by `launch`; runs inside the training container.

SageMaker describes the cluster in /opt/ml/input/config/resourceconfig.json:
    {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
Every host runs this same command. A host's place in the host list is its node rank and the
first host is the rendezvous master, so all hosts agree without talking first. Containers started
by the SageMaker training toolkit describe the same facts in SM_HOSTS and SM_CURRENT_HOST.
"""

import argparse
import json
import os
import sys


def cluster(path):
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        hosts, current = config["hosts"], config["current_host"]
        interface = config.get("network_interface_name")
    except FileNotFoundError:
        hosts = json.loads(os.environ.get("SM_HOSTS") or '["algo-1"]')
        current = os.environ.get("SM_CURRENT_HOST") or hosts[0]
        interface = os.environ.get("SM_NETWORK_INTERFACE_NAME")
    number = lambda host: (int(host.rsplit("-", 1)[-1]) if host.rsplit("-", 1)[-1].isdigit()
                           else 1 << 30, host)
    return sorted(hosts, key=number), current, interface


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--resource-config", required=True)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    hosts, current, interface = cluster(options.resource_config)
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nproc_per_node", str(options.nproc_per_node)]
    if len(hosts) == 1:
        argv += ["--standalone", "--role", "rank"]
    else:
        argv += ["--nnodes", str(len(hosts)), "--node_rank", str(hosts.index(current)),
                 "--master_addr", hosts[0], "--master_port", str(options.master_port),
                 "--role", "local_rank"]
        if interface:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    # --tee: every line of every process, prefixed with its (local) rank, in the host's log.
    argv += ["--tee", "3", options.script, *options.args]
    print(f"launch: {current}, node {hosts.index(current)} of {len(hosts)}: " + " ".join(argv),
          flush=True)
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
