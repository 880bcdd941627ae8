"""privzo run specs: pydantic models only (no torch), so validating a spec is instant."""
from specs.loading import SpecError, dump_yaml, json_schema, load_spec, parse_yaml, spec_from_dict
from specs.run import RunSpec, flatten

__all__ = ["RunSpec", "SpecError", "dump_yaml", "flatten", "json_schema", "load_spec", "parse_yaml", "spec_from_dict"]
