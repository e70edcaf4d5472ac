"""Stage 3, build: the rendered cells as images in the engine.

Takes ``Rendered`` cells from render/ and the base lock from define/.

- plan.py: which images to build and in which order -- parents first, what is cached, what
  is refused (an artifact without a verified checksum) or skipped; pure, no engine;
- bases.py: each OS row's base image as the engine has it -- the locked registry digest
  pulled, or trainbase's own debootstrap -- checked against locks/bases.json, identified,
  recorded in the labels of every image built FROM it; and ``build.py --lock-bases``;
- bootstrap.py, rootfs.py: that debootstrap (a Debian root filesystem trimmed like the
  official image, imported under trainbase's own name) where no registry serves the base;
- docker_build.py: one image's ``docker build`` -- its BuildKit command, the disk it needs,
  the log line that says why it failed.

Hands on the plan's ``Job``s (image, tag, status, reason) and the images under their
immutable tags; the supply chain documents them, delivery publishes them. Running a whole
plan -- in parallel, with the supply step after each build -- is run/executor.py's, above
every stage.
"""
