"""trainbase: the build package behind build.py, one subpackage per stage, in the order the
flow runs (each imports only from the ones before it; tests/unit/test_architecture.py checks):

    define/   matrix.yaml and the locks          -> a checked Matrix of cells
    render/   cells                              -> Dockerfiles, manifests, recipe tags
    build/    rendered cells                     -> a plan, base images, images in the engine
    supply/   built images                       -> inventory, SBOM, audit and budget verdicts
    deliver/  completed images and tags          -> published tags, the CI job matrix
    run/      one plan through build, supply and deliver (build.py build, alias --matrix)
    cli/      the command line: one subcommand per action; errors.py: the errors every stage raises
"""
