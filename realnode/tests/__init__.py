"""The real-node tier: a package, so that its node (fixtures of package scope in strata_testsupport.realnode) is
stopped and swept, its images' tens of GB with it, as soon as its last test ends rather than at the end of the
whole session, where it shared the disk with the kind tier's cluster."""
