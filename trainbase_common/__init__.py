"""What trainbase's build package (`trainbase`) and its conformance package (`conformance`)
share, and nothing else: the one adapter to the Docker engine (`engine`) and the states of a
build job that the build report carries (`states`). Neither package imports the other."""
