"""The test images: built from our Dockerfiles with buildah (build.py), run with runc (runtime.py)."""
