"""The sampling rules, each on the machinery of `mdmkit.samplers.core`; configs name them through the classes
`mdmkit.samplers` exports."""
