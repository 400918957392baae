"""The video index, on disk and in memory: listing millions of videos (a parallel folder scan or an
annotation file, listing.py), the index as flat arrays that forked DataLoader workers share
(flat.py), building and caching it once per dataset and the deterministic train/validation split
(index.py), a probed sample of the sources' sizes and keyframe intervals kept beside the index cache
(sources.py; OpenCV only inside probe_source), the latent cache's view list in the same flat form
(viewtable.py), and the latent cache's files: job, shards, manifest and fingerprint (latentcache.py;
torch only inside the two functions that write or check latent bytes). No torch or OpenCV at import: the launcher (input
checks, cache size), the `index` command, the trainer, preflight and bench all read it; it imports
nothing above errors.py and files.py.
"""
