"""The config tree's typed schema, every default written once (`schema`), and the checks across its keys made
before any work starts (`checks`)."""
