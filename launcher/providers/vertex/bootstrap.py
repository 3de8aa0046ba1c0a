# ruff: noqa: E401, I001, UP031 (this line is not sent: the job runs the rest, as it was)
import hashlib, io, json, os, re, sys, tarfile, tempfile

def unpack(uri, data):
    """Extract an archive after checking it is the one the job was created with: its name
    carries the hash of its files (names, modes, contents), and the bucket is writable by jobs."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = sorted(tar.getmembers(), key=lambda m: m.name)
        digest = hashlib.sha256()
        for m in members:
            if not m.isfile():
                sys.exit("launch: %s holds %s, which is not a plain file" % (uri, m.name))
            body = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
            mode = "x" if m.mode & 0o100 else "-"
            digest.update(("%s\0%s\0%s\n" % (m.name, mode, body)).encode())
        want = re.search(r"-([0-9a-f]{32})[.]tar[.]gz$", uri)
        if want is None or digest.hexdigest()[:32] != want.group(1):
            sys.exit("launch: %s is not the archive this job was created with (changed in the "
                     "bucket since it was staged)" % uri)
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall()

def fetch(uri):
    bucket, _, name = uri[len("gs://"):].partition("/")
    mounted = os.path.join("/gcs", bucket, name)
    if os.path.isfile(mounted):  # Cloud Storage FUSE: Vertex AI mounts buckets under /gcs
        with open(mounted, "rb") as f:
            return f.read()
    from google.cloud import storage
    return storage.Client().bucket(bucket).blob(name).download_as_bytes()

# -- run --
os.chdir(tempfile.mkdtemp(prefix="launch-"))
for uri in os.environ["LAUNCH_STAGED"].split():
    unpack(uri, fetch(uri))

spec = json.loads(os.environ.get("CLUSTER_SPEC") or "{}")
pools = spec.get("cluster", {})
task = spec.get("task", {})
primary, workers = pools.get("workerpool0", []), pools.get("workerpool1", [])
nodes = len(primary) + len(workers) if primary else int(os.environ.get("WORLD_SIZE", "1"))
if nodes > 1 and primary:
    host, _, port = primary[0].rpartition(":")
    rank = 0 if task.get("type") == "workerpool0" else 1 + int(task.get("index", 0))
    port = os.environ.get("MASTER_PORT") or port
elif nodes > 1:
    host, port = os.environ["MASTER_ADDR"], os.environ.get("MASTER_PORT", "29500")
    rank = int(os.environ["RANK"])
if nodes > 1:
    where = ["--nnodes", str(nodes), "--node_rank", str(rank),
             "--master_addr", host, "--master_port", str(port)]
else:
    rank, where = 0, ["--standalone", "--nnodes", "1"]
argv = [sys.executable, "-m", "torch.distributed.run"] + where + sys.argv[1:]
print("launch: node %d of %d in %s: %s" % (rank, nodes, os.getcwd(), " ".join(argv[3:])),
      flush=True)
os.execv(sys.executable, argv)
