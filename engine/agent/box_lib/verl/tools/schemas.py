"""verl's tool schemas without pydantic (not in the box): attribute access, `model_validate`, `model_dump`.

`OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name", "description",
"parameters"}})` gives `.type`, `.function.name`, `.function.description`, `.function.parameters.properties`
(each property with `.type`, `.description`, `.enum`), `.function.parameters.required`. `ToolResponse` is
verl 0.6+'s answer: `text`, `image`, `video` (the box answers text only)."""


class _Model:
    """A dict-backed record: nested dicts become records, `model_dump()` gives the dict back."""

    _nested: dict = {}

    def __init__(self, **fields):
        for key, value in fields.items():
            sub = self._nested.get(key)
            if sub is not None and isinstance(value, dict):
                value = sub.model_validate(value) if key != "properties" else \
                    {k: OpenAIFunctionPropertySchema.model_validate(v) for k, v in value.items()}
            setattr(self, key, value)

    @classmethod
    def model_validate(cls, data):
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__} needs a dict, got {type(data).__name__}")
        return cls(**data)

    def model_dump(self, exclude_unset=False, exclude_none=False, **_):
        out = {}
        for key, value in vars(self).items():
            if isinstance(value, _Model):
                value = value.model_dump(exclude_none=exclude_none)
            elif isinstance(value, dict):
                value = {k: v.model_dump(exclude_none=exclude_none) if isinstance(v, _Model) else v
                         for k, v in value.items()}
            if value is None and exclude_none:
                continue
            out[key] = value
        return out

    def __repr__(self):
        return f"{type(self).__name__}({self.model_dump()!r})"


class OpenAIFunctionPropertySchema(_Model):
    type = "string"
    description = None
    enum = None


class OpenAIFunctionParametersSchema(_Model):
    type = "object"
    properties: dict = {}
    required: list = []
    _nested = {"properties": _Model}


class OpenAIFunctionSchema(_Model):
    name = ""
    description = ""
    strict = False
    _nested = {"parameters": OpenAIFunctionParametersSchema}

    def __init__(self, **fields):
        fields.setdefault("parameters", {"type": "object", "properties": {}, "required": []})
        super().__init__(**fields)


class OpenAIFunctionToolSchema(_Model):
    type = "function"
    _nested = {"function": OpenAIFunctionSchema}


class ToolResponse(_Model):
    text = None
    image = None
    video = None

    def is_empty(self):
        return not self.text and not self.image and not self.video
