import logging
import warnings

import pytest


@pytest.fixture
def quiet_quantizer():
    """onnxruntime's quantizer logs its pre-processing advice and warns; silence both for
    one test (``pytestmark = pytest.mark.usefixtures("quiet_quantizer")``)."""
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)
