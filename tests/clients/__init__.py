"""The client libraries on commlib: Lightning Fabric, torchmetrics, mmengine."""
