"""What a forger with write access to the registry does: a version dressed in another's tags and description."""


def dress_as(client, name: str, version: str, like) -> None:
    """Give version ``version`` of ``name`` every tag and the description of model version ``like``."""
    for key, value in like.tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.update_model_version(name, version, description=like.description)
