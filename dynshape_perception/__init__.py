"""dynshape_perception: dynamic-shape perception on TVM Relax with a shape-specialising runtime."""

__version__ = "0.1.0"
